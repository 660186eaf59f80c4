"""Delivery to a Maildir (docs/delivery.md "qmail-local"): tmp/NAME, fsync, link to new/NAME.

C qmail forks a child per Maildir line; here the work happens in-process,
relative to a directory descriptor (no chdir), with the same steps and the
same results. One process makes many deliveries (qmail-lspawn's delivery
workers serve one account for up to a thousand), so a name is maildir(5)'s
modern unique name, TIME.MmicrosecondsPpidQcount.HOST (Q: the deliveries this
process has named so far), where C qmail's TIME.PID.HOST relies on a fresh pid
per delivery. It is still taken only if neither tmp/NAME nor new/NAME
exists. After the link, new/ is fsync'd too, so a reported success survives a
crash (qmail syncs the file only; we may sync more, never less).
"""
import os
import signal
import time

from qmailpy.fileio import write_all
from qmailpy.local.errors import Failure, error_temp

TEMPORARY = b"Temporary error on maildir delivery. (#4.3.0)"
CHDIR = b"Unable to chdir to maildir. (#4.2.1)"
TIMEOUT = b"Timeout on maildir delivery. (#4.3.0)"
READ = b"Unable to read message. (#4.3.0)"
TIME_LIMIT = 86400
_CHUNK = 65536


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _hostname():
    return os.uname().nodename.encode("utf-8", "surrogateescape")[:64]


_named = 0      # names made by this process (maildir(5)'s Q)


def _free_name(dirfd):
    global _named
    pid = os.getpid()
    host = _hostname()
    for loop in range(3):
        _named += 1
        now = time.time_ns() // 1000
        name = b"%d.M%dP%dQ%d.%s" % (now // 1000000, now % 1000000, pid, _named, host)
        for sub in (b"tmp/", b"new/"):
            try:
                os.stat(sub + name, dir_fd=dirfd)
                break               # taken
            except FileNotFoundError:
                continue
            except OSError:
                break
        else:
            return name
        if loop == 2:
            raise Failure(111, TEMPORARY)
        time.sleep(2)



def _copy(msgfd, fd, head):
    """Write head, then the message from msgfd's current offset to its end."""
    pending = head
    while True:
        try:
            chunk = os.read(msgfd, _CHUNK)
        except OSError:
            return False
        if not chunk:
            break
        if pending:
            chunk = pending + chunk
            pending = b""
        write_all(fd, chunk)
    if pending:
        write_all(fd, pending)
    return True


def deliver(path, msgfd, rpline, dtline):
    """Deliver the message on msgfd (already rewound) into the Maildir at path."""
    try:
        dirfd = os.open(path, os.O_PATH | os.O_DIRECTORY)
    except OSError as e:
        raise Failure(111, TEMPORARY if error_temp(e) else CHDIR) from e
    tmpname = None
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(TIME_LIMIT)
    try:
        name = _free_name(dirfd)
        tmpname, newname = b"tmp/" + name, b"new/" + name
        try:
            fd = os.open(tmpname, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dirfd)
        except OSError as e:
            tmpname = None          # not ours: never unlink what we did not create
            raise Failure(111, TEMPORARY) from e
        try:
            try:
                if not _copy(msgfd, fd, rpline + dtline):
                    raise Failure(111, READ)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmpname, newname, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except OSError as e:
            raise Failure(111, TEMPORARY) from e
        _sync_dir(dirfd, b"new")
    except _Timeout:
        raise Failure(111, TIMEOUT) from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        if tmpname is not None:
            try:
                os.unlink(tmpname, dir_fd=dirfd)
            except OSError:
                pass
        os.close(dirfd)


def _sync_dir(dirfd, name):
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dirfd)
    except OSError:
        return                      # unreadable new/: qmail would not have synced it either
    try:
        os.fsync(fd)
    except OSError as e:
        raise Failure(111, TEMPORARY) from e
    finally:
        os.close(fd)
