"""Delivery to an mbox file (docs/delivery.md "qmail-local").

Append under an exclusive flock (given up after LOCK_TIMEOUT seconds with a
temporary failure; other lock errors mean "write unlocked", as in qmail),
write the From_ line, Return-Path, Delivered-To and the message with '>'
before every line matching ^>*From , end with an empty line, fsync. A
failed write truncates the file back to where this delivery began, if we
held the lock (without it another writer may have appended since).
"""
import fcntl
import os
import signal

from qmailpy.fileio import write_all
from qmailpy.local.errors import Failure, error_str

LOCK_TIMEOUT = 30
SLOW_LOCK = b"File has been locked for 30 seconds straight. (#4.3.0)"
_FLUSH_AT = 65536


class _SlowLock(Exception):
    pass


def _on_alarm(signum, frame):
    raise _SlowLock()


def _lock(fd, timeout):
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except _SlowLock:
        raise Failure(111, SLOW_LOCK) from None
    except OSError:
        return False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def is_from(line):
    """A line an mbox reader would take for a message's start: 'From ' after any '>'s
    (qmail's gfrom; such a line gets one more '>')."""
    return line.lstrip(b">").startswith(b"From ")



def _quoted(msgfd):
    """The message with >From quoting and a final newline, in blocks."""
    reader = open(msgfd, "rb", closefd=False)
    out = bytearray()
    last = b"\n"
    for line in reader:
        if is_from(line):
            out += b">"
        out += line
        last = line
        if len(out) >= _FLUSH_AT:
            yield bytes(out)
            out.clear()
    if not last.endswith(b"\n"):
        out += b"\n"
    out += b"\n"
    yield bytes(out)


def deliver(path, msgfd, ufline, rpline, dtline, lock_timeout=LOCK_TIMEOUT):
    """Append the message on msgfd (already rewound) to the mbox at path."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as e:
        raise Failure(111, b"Unable to open " + path + b": " + error_str(e)
                      + b". (#4.2.1)") from e
    try:
        locked = _lock(fd, lock_timeout)
        start = os.lseek(fd, 0, os.SEEK_END)
        blocks = _quoted(msgfd)
        head = ufline + rpline + dtline
        try:
            try:
                first = next(blocks)
            except OSError as e:
                raise _ReadError(e) from e
            write_all(fd, head + first)
            while True:
                try:
                    block = next(blocks, None)
                except OSError as e:
                    raise _ReadError(e) from e
                if block is None:
                    break
                write_all(fd, block)
            os.fsync(fd)
        except _ReadError as e:
            _truncate(fd, start, locked)
            raise Failure(111, b"Unable to read message: " + error_str(e.error)
                          + b". (#4.3.0)") from None
        except OSError as e:
            _truncate(fd, start, locked)
            raise Failure(111, b"Unable to write " + path + b": " + error_str(e)
                          + b". (#4.3.0)") from e
    finally:
        os.close(fd)


def _truncate(fd, start, locked):
    if locked:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass


class _ReadError(Exception):
    def __init__(self, error):
        super().__init__(error)
        self.error = error
