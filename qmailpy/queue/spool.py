"""A message on its way to qmail-qmqpd, held in bounded memory (docs/submission.md "Handing a message to qmail-qmqpd").

QMQP puts the message's length before the message, and a submitter (a qmail-smtpd
session, sendmail) learns the length only at the end. So the message is held
until then: in memory up to IN_MEMORY bytes (nearly every message: no file, no
extra write), beyond that in an unlinked file in $TMPDIR (default /tmp) opened
with O_TMPFILE, so no other process can reach it by name and nothing is left
behind if the submitter dies. Either way the submitter's memory stays bounded
whatever the message's size, and the request reaches the server whole and at
disk speed: a slow SMTP client never holds a queue server's worker.

Imports are kept to os: every injector may load this.
"""
import os

IN_MEMORY = 1 << 20         # bytes held in memory before the message goes to a file
CHUNK = 65536               # bytes copied per write to the file or the socket
_NO_TMPFILE = (95, 21, 22)  # EOPNOTSUPP, EISDIR, EINVAL: the file system or kernel lacks O_TMPFILE


class SpoolError(OSError):
    """The spool file could not be made or written (disk full, no $TMPDIR)."""


def spool_dir(environ=None):
    environ = os.environ if environ is None else environ
    path = environ.get("TMPDIR", "")
    return path if path.startswith("/") else "/tmp"


def _open_unnamed(directory):
    """A read-write file in directory that has no name (O_TMPFILE, or a name removed at once)."""
    tmpfile = getattr(os, "O_TMPFILE", None)
    if tmpfile is not None:
        try:
            return os.open(directory, tmpfile | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno not in _NO_TMPFILE:
                raise
    for _ in range(100):
        name = os.path.join(directory, "qmailpy-spool.%d.%s" % (os.getpid(), os.urandom(6).hex()))
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        os.unlink(name)
        return fd
    raise FileExistsError(17, "no free spool file name")


class Spool:
    """Message bytes written in pieces, then read back in order; .size, .error (an OSError or None)."""

    def __init__(self):
        self.directory = spool_dir()
        self.memory = bytearray()
        self.fd = None
        self.size = 0
        self.error = None

    def write(self, data):
        if self.error is not None:
            return
        self.size += len(data)
        self.memory += data
        if self.fd is None and len(self.memory) <= IN_MEMORY:
            return
        if len(self.memory) >= CHUNK or self.fd is None:
            self._to_file()

    def _to_file(self):
        from qmailpy.fileio import write_all
        try:
            if self.fd is None:
                self.fd = _open_unnamed(self.directory)
            write_all(self.fd, self.memory)
        except OSError as e:
            self.error = SpoolError(e.errno, "unable to spool the message in %s: %s"
                                    % (self.directory, e.strerror))
        self.memory.clear()

    def pieces(self):
        """The message again, from its start, in pieces of at most max(CHUNK, IN_MEMORY) bytes.
        Raises SpoolError when the file cannot be read back."""
        if self.fd is None:
            if self.memory:
                yield self.memory
            return
        if self.memory:
            self._to_file()
            if self.error is not None:
                raise self.error
        offset = 0
        while True:
            try:
                chunk = os.pread(self.fd, CHUNK, offset)
            except OSError as e:
                raise SpoolError(e.errno, "unable to read the spooled message: %s" % e.strerror)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    def close(self):
        self.memory = bytearray()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        try:
            self.close()
        except (OSError, AttributeError):
            pass
