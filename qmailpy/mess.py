"""Writing a new message body into mess/ (S1 -> S2), the one place it is done.

The steps are qmail-queue's (docs/queue-format.md "qmail-queue (S1→S4)", steps 2 to 4;
docs/queue-format.md "mess/S/n"), the same for both backends:

  pid/{pid}.{start}.{seq} (O_EXCL, seq 1..9) -> link to mess/S/n -> unlink the pid name
  -> the first bytes (the Received line) + the body -> fsync the file -> fsync mess/S

qmail-queue (qmailpy.queue.qmailqueue, also run by qmail-qmqpd's children) and
the log backend's in-memory enqueue (qmailpy.backends.log.enqueue) call these.
A failed step raises Failure carrying qmail-queue's exit code.

Imports stay what qmail-queue already loads: this runs once per message.
"""
import os

from qmailpy.fileio import fsync_dir, write_all
from qmailpy.layout import SPLIT

CHUNK = 65536                     # qmail-queue's buffer: bytes per read, and per write of the body
NOT_BEFORE = "QMAILNOTBEFORE"     # qmail-queue's variable for it (docs/queue-format.md "Not-before time")
HOLD = "QMAILHOLD"                # qmail-queue's variable asking for a hold (docs/queue-format.md "Hold at queueing")
# The mess file's owner-execute bit: its queueing asked for a hold, which qmail-send turns
# into its own (hold/n, or the held bit of the PREPROCESSED record) when it preprocesses
# the message. qmail-queue makes mess files 0644; real qmail never looks at the mode.
HOLD_MODE = 0o100
MAX_HOLD = 7 * 86400              # seconds: the longest hold qmail-qmqpd and qmail-smtpd take
                                  # from callers without queue rights (qmail's default queuelifetime)


def not_before_of(environ):
    """$QMAILNOTBEFORE as epoch seconds, None when unset; ValueError unless decimal digits."""
    value = environ.get(NOT_BEFORE)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 12:
        raise ValueError(value)
    return int(value)


def hold_of(environ):
    """$QMAILHOLD: True when "1", False when unset; ValueError for anything else (a typo
    must not deliver what was meant to be held)."""
    value = environ.get(HOLD)
    if value is None:
        return False
    if value != "1":
        raise ValueError(value)
    return True


def hold_asked(st_mode):
    """Whether a mess file's mode (os.stat's st_mode) carries a queueing's hold request."""
    return bool(st_mode & HOLD_MODE)


class Failure(Exception):
    """A step of qmail-queue failed; .code is its exit code (docs/protocols.md "qmail-queue interface")."""

    def __init__(self, code):
        self.code = code


def create_mess(queue_dir, pid, start):
    """S1 -> S2, first half: (fd, n, messdir, messfn) of a new, empty mess/S/n.

    A fresh inode under pid/ (O_EXCL, seq 1..9), linked into mess/ under its
    number, its pid/ name removed. Failure(63) or Failure(64) as qmail-queue."""
    prefix = "" if queue_dir == "." else queue_dir + "/"
    for seq in range(1, 10):
        pidfn = "%spid/%d.%d.%d" % (prefix, pid, start, seq)
        try:
            fd = os.open(pidfn, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except OSError:
            continue
    else:
        raise Failure(63)
    try:
        n = os.fstat(fd).st_ino
        messdir = "%smess/%d" % (prefix, n % SPLIT)
        messfn = "%s/%d" % (messdir, n)
        try:
            os.link(pidfn, messfn)
        except OSError:
            raise Failure(64) from None
        try:
            os.unlink(pidfn)
        except OSError:
            raise Failure(63) from None
    except BaseException:
        os.close(fd)
        raise
    return fd, n, messdir, messfn


def fill_mess(fd, messdir, first, read, not_before=None, sync_dir=fsync_dir, hold=False):
    """S1 -> S2, second half: first, then read() until b"", into fd; fsync it and messdir
    (with sync_dir(messdir): a queueing worker's shares the fsync, qmailpy.groupsync).

    not_before (epoch seconds), when given, becomes the file's mtime, synced with it: the
    message's not-before time (docs/queue-format.md "Not-before time"). hold sets HOLD_MODE,
    synced with it too, so the request is on disk before the envelope can be.
    Failure(54) when read fails, Failure(53) when writing or syncing does; the
    caller removes the file then."""
    buf = first
    while True:
        try:
            chunk = read()
        except OSError:
            raise Failure(54) from None
        if chunk:
            buf = buf + chunk if buf else chunk
        if buf and (len(buf) >= CHUNK or not chunk):
            try:
                write_all(fd, buf)
            except OSError:
                raise Failure(53) from None
            buf = b""
        if not chunk:
            break
    try:
        if not_before is not None:        # mtime only: the 36-hour cleanup reads the atime
            os.utime(fd, ns=(os.fstat(fd).st_atime_ns, not_before * 1000000000))
        if hold:
            os.fchmod(fd, (os.fstat(fd).st_mode & 0o7777) | HOLD_MODE)
        os.fsync(fd)
        sync_dir(messdir)             # mess/S/n must be on disk before todo/n (or ENVELOPE) can be
    except OSError:
        raise Failure(53) from None
