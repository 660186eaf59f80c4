"""fsync of a directory, after a link, rename or unlink the queue relies on.

qmail assumes that link() and rename() reach the disk synchronously; ext4 and
xfs promise that only after an fsync of the directory (what qmail's "syncdir"
patch does). Every program that needs it calls this one function.
"""
import os


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
