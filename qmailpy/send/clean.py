"""qmail-clean and its protocol, both ends (docs/protocols.md "qmail-send ↔ qmail-clean"; docs/queue-format.md "Cleanup (36 h = 129600 s)").

qmail-send never unlinks todo/, intd/ or mess/ files itself: it asks
qmail-clean, which runs as the owner of those files. Request `foop/{n}\\0`
(unlink intd/n, then mess/S/n) or `todo/{n}\\0` (unlink intd/n, then todo/n);
reply one byte: `+` done, `!` an unlink failed (not ENOENT), `x` bad request.
Before its first request and then before every 31st, qmail-clean removes
pid/ files older than 36 hours (atime).
"""
import collections
import os
import time

from qmailpy.backends.base import CleanerLost  # noqa: F401  (raised here, caught by qmail-send)
from qmailpy.fileio import write_all
from qmailpy.layout import relpath
from qmailpy.states import LEFTOVER_AGE   # 36 hours; exceeds qmail-queue's 24 h alarm

CLEANUP_EVERY = 31
REQUEST_MAX = 100          # bytes, including the final NUL




# --- qmail-send's end -----------------------------------------------------

class CleanClient:
    """Requests to qmail-clean over two pipe descriptors.

    request() and request_many() wait for their replies. send_async() does not:
    its reply is read later by poll() (when reply_fd is readable) or before the
    next waiting request, and handed to on_late_reply(name, reply). qmail-clean
    answers in order, so `pending` names the requests still unanswered."""

    def __init__(self, request_fd=5, reply_fd=6):
        self.request_fd, self.reply_fd = request_fd, reply_fd
        self.pending = collections.deque()
        self.on_late_reply = None

    def send_async(self, name):
        data = name.encode("ascii") + b"\0" if isinstance(name, str) else name + b"\0"
        try:
            write_all(self.request_fd, data)
        except OSError as e:
            raise CleanerLost(str(e)) from e
        self.pending.append(name)

    def poll(self):
        """Read the replies that are there (call when reply_fd is readable)."""
        if self.pending:
            try:
                replies = os.read(self.reply_fd, len(self.pending))
            except OSError as e:
                raise CleanerLost(str(e)) from e
            self._late(replies)

    def drain(self):
        """Wait for every pending reply."""
        while self.pending:
            self.poll()

    def _late(self, replies):
        if not replies:
            raise CleanerLost("EOF")
        for ch in replies:
            name = self.pending.popleft()
            if self.on_late_reply is not None:
                self.on_late_reply(name, bytes((ch,)))

    def request(self, name):
        """Send 'todo/123' or 'foop/123'; return the reply byte (b'+', b'!' or b'x')."""
        self.drain()
        data = name.encode("ascii") + b"\0" if isinstance(name, str) else name + b"\0"
        try:
            write_all(self.request_fd, data)
            reply = os.read(self.reply_fd, 1)
        except OSError as e:
            raise CleanerLost(str(e)) from e
        if not reply:
            raise CleanerLost("EOF")
        return reply

    def request_many(self, names):
        """Several requests in one write; their reply bytes in order."""
        self.drain()
        data = b"".join((n.encode("ascii") if isinstance(n, str) else n) + b"\0" for n in names)
        replies = b""
        try:
            write_all(self.request_fd, data)
            while len(replies) < len(names):
                chunk = os.read(self.reply_fd, len(names) - len(replies))
                if not chunk:
                    raise CleanerLost("EOF")
                replies += chunk
        except OSError as e:
            raise CleanerLost(str(e)) from e
        return [replies[i:i + 1] for i in range(len(replies))]


# --- qmail-clean's end ----------------------------------------------------

def cleanup_pid(now=None):
    """Unlink pid/ files whose atime is at least 36 hours old (cwd = queue/)."""
    now = int(time.time()) if now is None else now
    try:
        names = os.listdir("pid")
    except OSError:
        return
    for name in names:
        path = "pid/" + name
        try:
            if now < os.stat(path).st_atime + LEFTOVER_AGE:
                continue
            os.unlink(path)
        except OSError:
            continue


def _unlink(path):
    """True unless the unlink failed with something other than ENOENT."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def answer(request):
    """The reply byte for one request (without its NUL); performs the unlinks."""
    if len(request) + 1 < 7 or len(request) + 1 > REQUEST_MAX:
        return b"x"
    kind, digits = request[:5], request[5:]
    if not digits.isdigit() or not digits.isascii():
        return b"x"
    n = int(digits)
    if kind == b"foop/":
        second = relpath("mess", n)
    elif kind == b"todo/":
        second = relpath("todo", n)
    else:
        return b"x"
    if not _unlink(relpath("intd", n)) or not _unlink(second):
        return b"!"
    return b"+"


def serve(infd=0, outfd=1):
    """Answer requests until EOF on infd; returns the exit code (0, or 100 on a write error)."""
    pending = bytearray()
    countdown = 0
    while True:
        if countdown:
            countdown -= 1
        else:
            cleanup_pid()
            countdown = CLEANUP_EVERY - 1
        while b"\0" not in pending:
            try:
                data = os.read(infd, 4096)
            except InterruptedError:
                continue
            except OSError:
                return 0
            if not data:
                return 0
            pending += data
        end = pending.index(b"\0")
        request = bytes(pending[:end])
        del pending[:end + 1]
        try:
            os.write(outfd, answer(request))
        except OSError:
            return 100
