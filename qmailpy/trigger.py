"""The lock/trigger named pipe (docs/protocols.md "Trigger (`lock/trigger`)").

Pulling never blocks: with no reader the open fails with ENXIO and nothing
happens. qmail-send holds the read end open non-blocking and reopens it before
every todo scan (on Linux the read end stays readable at EOF until reopened).
"""
import os
import stat

TRIGGER = "lock/trigger"


def pull(queue_dir):
    """Wake qmail-send, if one is listening. Never blocks, never raises. Writes only
    into a named pipe reached without a symlink: root's qmailctl pulls it, and lock/
    is qmailq's, who could put a link to /etc/passwd there (docs/security.md)."""
    try:
        fd = os.open(os.path.join(queue_dir, TRIGGER),
                     os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, b"\0")
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


def open_reader(queue_dir):
    """The read end qmail-send selects on (O_RDONLY|O_NONBLOCK)."""
    return os.open(os.path.join(queue_dir, TRIGGER), os.O_RDONLY | os.O_NONBLOCK)


def reopen_reader(queue_dir, fd):
    """Close and reopen the read end, discarding whatever was written (before a todo scan)."""
    if fd is not None and fd >= 0:
        os.close(fd)
    return open_reader(queue_dir)
