"""qmail-qmtpd: QMTP on fds 0/1, as qmail's (qmail-qmtpd(8); docs/protocols.md "QMTP").

Each request is three netstrings: the message (its first byte \\n for LF line ends,
\\r for CRLF, which become LF), the sender, and a netstring of recipient
netstrings. Each recipient gets one netstring back, in order: K (queued), Z
(temporary) or D (permanent failure) and a text. The rules are qmail-smtpd's, read
by the same code (SmtpdConfig, rcpt_allowed, received_line): control/rcpthosts and
morercpthosts.cdb unless RELAYCLIENT is set (then appended to each recipient),
control/databytes or $DATABYTES, and a Received line "with QMTP".

A malformed netstring ends the session with exit 100, a closed connection with exit
0, both queueing nothing; unreadable controls exit 111. The whole session has
SESSION_TIMEOUT seconds, qmail's alarm(3600), after which it exits 111.
"""
import os
import select
import time

from qmailpy.queuelimits import EnvelopeBudget
from qmailpy.smtpd.address import rcpt_allowed
from qmailpy.smtpd.config import SetupError, SmtpdConfig
from qmailpy.smtpd.received import received_line

SESSION_TIMEOUT = 3600
MAX_ADDRESS = 1000          # qmail's buffer: an address this long (with RELAYCLIENT) is refused
MAX_LENGTH = 200000000      # qmail's getlen(): a longer netstring ends the session, exit 111
CHUNK = 65536
OUT_LIMIT = 65536
WRITE_PIECE = 4096        # at most what a writable socket or pipe takes without blocking

BAD_RECIPIENT = b"Dsorry, I can't handle that recipient (#5.1.3)"
NOT_RCPTHOSTS = b"Dsorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)"
BAD_SENDER = b"Dunacceptable sender (#5.1.7)"
TOO_BIG = b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"
TOO_MANY = b"Zsorry, too many recipients (#4.5.3)"
# a recipient's verdict, one byte each (a request may name millions): 0 is the request's result
REFUSALS = (None, BAD_RECIPIENT, NOT_RCPTHOSTS, TOO_MANY)


class End(Exception):
    def __init__(self, code):
        self.code = code


class Wire:
    """fd 0 read in chunks against the session deadline; replies held until the next read
    or until OUT_LIMIT bytes of them wait (a request may name millions of recipients)."""

    def __init__(self, deadline):
        self.deadline = deadline
        self.buf = b""
        self.pos = 0            # consumed part of buf (slicing per byte would be quadratic)
        self.out = []
        self.outlen = 0

    def _poll(self, fd, event):
        left = self.deadline - time.monotonic()
        poller = select.poll()
        poller.register(fd, event)
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            raise End(111)

    def _fill(self):
        if self.out:
            self._flush()
        self._poll(0, select.POLLIN)
        try:
            data = os.read(0, CHUNK)
        except OSError:
            raise End(0) from None
        if not data:
            raise End(0)
        self.buf, self.pos = data, 0

    def _flush(self):
        data = memoryview(b"".join(self.out))
        self.out, self.outlen = [], 0
        try:
            while data:
                self._poll(1, select.POLLOUT)
                data = data[os.write(1, data[:WRITE_PIECE]):]
        except OSError:
            raise End(0) from None

    def byte(self):
        if self.pos >= len(self.buf):
            self._fill()
        self.pos += 1
        return self.buf[self.pos - 1:self.pos]

    def take(self, n):
        """Up to n bytes (at least one)."""
        if self.pos >= len(self.buf):
            self._fill()
        piece = self.buf[self.pos:self.pos + n]
        self.pos += len(piece)
        return piece

    def exactly(self, n):
        parts = []
        while n:
            piece = self.take(n)
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def length(self, first=b"", limit=None):
        """A netstring's length up to its ':' and the bytes that took; limit: the bytes it may
        take (recipient list). As qmail's getlen(), a value past MAX_LENGTH is exit 111 however
        many leading zeros come first."""
        value, used, ch = 0, len(first), first
        while True:
            if not ch:
                if limit is not None and limit <= used:
                    raise End(100)
                ch = self.byte()
                used += 1
            if ch == b":":
                break
            if not ch.isdigit():
                raise End(100)
            if value > MAX_LENGTH:
                raise End(111)
            value = 10 * value + ch[0] - 48
            ch = b""
        if used == 1:
            raise End(100)
        return value, used

    def comma(self):
        if self.byte() != b",":
            raise End(100)

    def skip(self, n):
        while n:
            n -= len(self.take(n))

    def reply(self, text):
        self.out.append(b"%d:%s," % (len(text), text))
        self.outlen += len(self.out[-1])
        if self.outlen >= OUT_LIMIT:
            self._flush()


def _copy_message(wire, length, sink, databytes):
    """The message netstring's body after its format byte; False when it went past databytes
    (then nothing more is given to sink)."""
    flagdos = wire.byte()
    length -= 1
    if flagdos not in (b"\n", b"\r"):
        raise End(100)
    flagdos = flagdos == b"\r"
    if databytes and not flagdos and length > databytes:
        wire.skip(length)
        return False
    stored = 0
    carry = b""             # a CR at a chunk's end, which the next chunk may pair with LF
    while length:
        piece = wire.take(length)
        length -= len(piece)
        if flagdos:
            piece = carry + piece
            carry = b""
            if piece.endswith(b"\r") and length:
                piece, carry = piece[:-1], b"\r"
            piece = piece.replace(b"\r\n", b"\n")
        stored += len(piece)
        if databytes and stored > databytes:
            wire.skip(length)
            return False
        sink(piece)
    return True


def serve(home, environ):
    """One QMTP session; the exit code."""
    wire = Wire(time.monotonic() + SESSION_TIMEOUT)
    try:
        try:
            cfg = SmtpdConfig(home, environ)
            cfg.more_lookup()
        except SetupError:
            return 111
        relay = cfg.relayclient
        while True:
            try:
                first = wire.byte()
            except End as e:
                if e.code == 0:         # the client is done
                    wire._flush()
                return e.code
            length, _ = wire.length(first)
            if length == 0:
                raise End(100)
            _request(home, environ, wire, cfg, relay, length)
    except End as e:
        return e.code


def _request(home, environ, wire, cfg, relay, length):
    from qmailpy.queue.client import QueueClient
    try:
        qq = QueueClient(home, environ, prefer_server=True)
    except OSError:
        raise End(111)
    try:
        fits = True
        qq.write(received_line(cfg.remotehost, None, cfg.remoteinfo, cfg.remoteip,
                               cfg.localhost, protocol=b"QMTP"))
        fits = _copy_message(wire, length, qq.write, cfg.databytes)
        wire.comma()
        length, _ = wire.length()
        sender_ok = length < MAX_ADDRESS
        if sender_ok:
            sender = wire.exactly(length)
            sender_ok = b"\0" not in sender
        else:
            wire.skip(length)
        wire.comma()
        biglen, _ = wire.length()
        verdicts, recipients = bytearray(), []
        budget = EnvelopeBudget(cfg.maxrcpt)
        while biglen > 0:
            length, used = wire.length(limit=biglen)
            biglen -= used
            if length >= biglen:
                raise End(100)
            verdict = 0
            if length + len(relay or b"") >= MAX_ADDRESS:
                wire.skip(length)
                verdict = 1
            else:
                addr = wire.exactly(length)
                if b"\0" in addr:
                    verdict = 1
                elif relay is not None:
                    addr += relay
                else:
                    try:
                        if not rcpt_allowed(addr, cfg.rcpthosts, cfg.more_lookup()):
                            verdict = 2
                    except SetupError:
                        raise End(111)
                if not verdict and not budget.admit(len(addr)):
                    verdict = 3
                if not verdict:
                    recipients.append(addr)
            verdicts.append(verdict)
            wire.comma()
            biglen -= length + 1
        wire.comma()
    except BaseException:
        qq.abort()
        raise
    if not fits:            # qmail's order: the size refusal wins over the sender's
        qq.abort()
        result = TOO_BIG
    elif not sender_ok:
        qq.abort()
        result = BAD_SENDER
    elif not recipients:
        qq.abort()
        result = None
    else:
        done = qq.finish(sender, recipients)
        if done.ok:
            result = b"Kok %d qp %d" % (int(time.time()), done.pid)
        else:
            result = (b"D" if done.permanent else b"Z") + done.text
    for verdict in verdicts:
        wire.reply(REFUSALS[verdict] or result)
