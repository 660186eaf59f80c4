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


def open_std_fds():
    """Callers run sendmail with fds closed (GNU mailutils' mail closes 1 and 2, a
    daemon may close 0): give each closed one /dev/null, so that Python's sys.std*
    exist and no file opened later lands on fd 1 or 2 and receives messages.
    Returns the fds that were closed."""
    import sys
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
            got = os.open("/dev/null", os.O_RDWR)
            if got != fd:                 # a lower fd was free as well: it gets its own turn
                os.dup2(got, fd)
                os.close(got)
            name = ("stdin", "stdout", "stderr")[fd]
            setattr(sys, name, os.fdopen(fd, "r" if fd == 0 else "w", closefd=False))
    return tuple(closed)


def stdout_gone():
    """A reader of our output went away (`qmailctl stat | head`): point fd 1 at
    /dev/null so that the interpreter's last flush does not fail again; the exit
    status for the caller to return (that of a process killed by SIGPIPE)."""
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return 141


def write_all(fd, data):
    """os.write until every byte of data is written (a pipe or a file may take less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def create_fresh(path, mode):
    """A descriptor of a new file at path, open for writing: whatever is at the name (a
    stale copy, or a symlink or FIFO another account planted in a shared directory such
    as queue/log/) is unlinked first, and the file made with O_EXCL | O_NOFOLLOW, so it
    is never written through."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
