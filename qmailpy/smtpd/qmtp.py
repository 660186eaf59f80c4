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

BAD_RECIPIENT = b"Dsorry, I can't handle that recipient (#5.1.3)"
NOT_RCPTHOSTS = b"Dsorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)"
BAD_SENDER = b"Dunacceptable sender (#5.1.7)"
TOO_BIG = b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"
TOO_MANY = b"Zsorry, too many recipients (#4.5.3)"


class End(Exception):
    def __init__(self, code):
        self.code = code


class Wire:
    """fd 0 read in chunks against the session deadline; replies held until the next read."""

    def __init__(self, deadline):
        self.deadline = deadline
        self.buf = b""
        self.out = []

    def _fill(self):
        if self.out:
            self._flush()
        left = self.deadline - time.monotonic()
        poller = select.poll()
        poller.register(0, select.POLLIN)
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            raise End(111)
        try:
            data = os.read(0, CHUNK)
        except OSError:
            raise End(0) from None
        if not data:
            raise End(0)
        self.buf += data

    def _flush(self):
        data = b"".join(self.out)
        self.out = []
        try:
            while data:
                data = data[os.write(1, data):]
        except OSError:
            raise End(0) from None

    def byte(self):
        if not self.buf:
            self._fill()
        ch, self.buf = self.buf[:1], self.buf[1:]
        return ch

    def take(self, n):
        """Up to n bytes (at least one)."""
        if not self.buf:
            self._fill()
        piece, self.buf = self.buf[:n], self.buf[n:]
        return piece

    def exactly(self, n):
        parts = []
        while n:
            piece = self.take(n)
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def length(self, first=b"", limit=None):
        """A netstring's length up to its ':'; limit: the bytes it may take (recipient list)."""
        digits = first
        while True:
            if limit is not None:
                if limit <= len(digits):
                    raise End(100)
            ch = self.byte()
            if ch == b":":
                break
            if not ch.isdigit():
                raise End(100)
            digits += ch
            if len(digits) > 9 and int(digits) > MAX_LENGTH:
                raise End(111)
        if not digits:
            raise End(100)
        return int(digits), len(digits) + 1

    def comma(self):
        if self.byte() != b",":
            raise End(100)

    def skip(self, n):
        while n:
            n -= len(self.take(n))

    def reply(self, text):
        self.out.append(b"%d:%s," % (len(text), text))


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
        verdicts, recipients = [], []
        budget = EnvelopeBudget(cfg.maxrcpt)
        while biglen > 0:
            length, used = wire.length(limit=biglen)
            biglen -= used
            if length >= biglen:
                raise End(100)
            verdict = None
            if length + len(relay or b"") >= MAX_ADDRESS:
                wire.skip(length)
                verdict = BAD_RECIPIENT
            else:
                addr = wire.exactly(length)
                if b"\0" in addr:
                    verdict = BAD_RECIPIENT
                elif relay is not None:
                    addr += relay
                else:
                    try:
                        if not rcpt_allowed(addr, cfg.rcpthosts, cfg.more_lookup()):
                            verdict = NOT_RCPTHOSTS
                    except SetupError:
                        raise End(111)
                if verdict is None and not budget.admit(len(addr)):
                    verdict = TOO_MANY
                if verdict is None:
                    recipients.append(addr)
            verdicts.append(verdict)
            wire.comma()
            biglen -= length + 1
        wire.comma()
    except BaseException:
        qq.abort()
        raise
    if not sender_ok:
        qq.abort()
        result = BAD_SENDER
    elif not fits:
        qq.abort()
        result = TOO_BIG
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
        wire.reply(verdict or result)
