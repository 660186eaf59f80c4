"""Writing whole buffers, and fsync of a directory after a link, rename or unlink.

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


def write_all(fd, data):
    """os.write until every byte of data is written (a pipe or a file may take less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
