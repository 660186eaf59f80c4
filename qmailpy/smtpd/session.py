"""One qmail-smtpd session on a pair of file descriptors (docs/submission.md "qmail-smtpd").

Replies are buffered and flushed just before the next read, as qmail's
substdio does, so a pipelining client gets one write per batch. Every read and
write is bounded by timeoutsmtpd; a read timeout is answered with 451, a write
timeout or EOF ends the session silently. Not in qmail: the whole session
(timeoutsmtpdsession) and each DATA (timeoutsmtpddata) have deadlines, so a
client that keeps every single wait short (one byte a second) is still cut off,
with the same 451; a DATA cut off queues nothing.
"""
import os
import select
import time

from qmailpy.smtpd.address import (MAX_ADDRESS, addrparse, badmailfrom, localiphost_rewrite,
                                   rcpt_allowed, size_parameter)
from qmailpy.smtpd.config import SetupError, SmtpdConfig
from qmailpy.smtpd.data import MAX_HOPS, DataReader, StrayNewline
from qmailpy.smtpd.received import received_line

READ_SIZE = 65536
# qmail has no limit; a longer command line is discarded up to its LF and answered
# with 500, so a client cannot make the server buffer without bound.
MAX_COMMAND = 4096

R_CONTROLS = b"421 unable to read controls (#4.3.0)\r\n"
R_IPME = b"421 unable to figure out my IP addresses (#4.3.0)\r\n"
R_OK = b"250 ok\r\n"
R_SYNTAX = b"555 syntax error (#5.5.4)\r\n"
R_MAIL_FIRST = b"503 MAIL first (#5.5.1)\r\n"
R_RCPT_FIRST = b"503 RCPT first (#5.5.1)\r\n"
R_BADMAILFROM = b"553 sorry, your envelope sender is in my badmailfrom list (#5.7.1)\r\n"
R_NOGATEWAY = b"553 sorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)\r\n"
# 452, as RFC 5321 has it for too many recipients: the client sends the rest later
R_MAXRCPT = b"452 sorry, too many recipients (#4.5.3)\r\n"
R_GO_AHEAD = b"354 go ahead\r\n"
R_QQT = b"451 qqt failure (#4.3.0)\r\n"
R_HOPS = b"554 too many hops, this message is looping (#5.4.6)\r\n"
R_SIZE = b"552 sorry, that message size exceeds my databytes limit (#5.3.4)\r\n"
R_FLUSHED = b"250 flushed\r\n"
R_VRFY = b"252 send some mail, i'll try my best\r\n"
R_HELP = b"214 qmail home page: http://pobox.com/~djb/qmail.html\r\n"
R_UNIMPL = b"502 unimplemented (#5.5.1)\r\n"
R_TIMEOUT = b"451 timeout (#4.4.2)\r\n"
R_SMTPLF = b"451 See https://cr.yp.to/docs/smtplf.html.\r\n"
R_TOO_LONG = b"500 command line too long (#5.5.2)\r\n"

# After a deadline, the 451 gets this long to go out to a client that does not read.
DEADLINE_GRACE = 5


class _End(Exception):
    """The session is over; .code is the exit status, .reply a last reply or None."""

    def __init__(self, code, reply=None, deadline=False):
        self.code, self.reply, self.deadline = code, reply, deadline


class Session:
    def __init__(self, home, environ=None, in_fd=0, out_fd=1, queue_client=None):
        self.home = home
        self.environ = os.environ if environ is None else environ
        self.in_fd, self.out_fd = in_fd, out_fd
        self._queue_client = queue_client
        self.inbuf = bytearray()
        self.out = bytearray()
        self.cfg = None
        self.seenmail = False
        self.flagbarf = False
        self.mailfrom = b""
        self.rcpt = []
        self.fakehelo = None
        self._local_ips = None
        self.until = None           # time.monotonic() deadline of the session or DATA

    # -- I/O -------------------------------------------------------------
    def _wait_ms(self):
        """How long one read or write may wait: timeoutsmtpd, or less before a deadline."""
        wait = self.cfg.timeout if self.cfg else 1200
        if self.until is not None:
            left = self.until - time.monotonic()
            if left <= 0:
                return 0
            wait = min(wait, left)
        return max(1, int(wait * 1000))

    def flush(self):
        view = memoryview(self.out)
        poller = select.poll()
        poller.register(self.out_fd, select.POLLOUT)
        try:
            while view:
                wait = self._wait_ms()
                if not wait or not poller.poll(wait):
                    raise _End(1)
                view = view[os.write(self.out_fd, view):]
        except OSError:
            raise _End(1)
        finally:
            view.release()
            self.out.clear()

    def fill(self):
        """Flush replies, then wait (timeoutsmtpd) for more input; EOF ends the session."""
        if self.until is not None and time.monotonic() >= self.until:
            raise _End(1, R_TIMEOUT, deadline=True)
        if self.out:
            self.flush()
        poller = select.poll()
        poller.register(self.in_fd, select.POLLIN)
        wait = self._wait_ms()
        if not wait or not poller.poll(wait):
            raise _End(1, R_TIMEOUT, deadline=self.until is not None
                       and time.monotonic() >= self.until)
        try:
            data = os.read(self.in_fd, READ_SIZE)
        except OSError:
            raise _End(1)
        if not data:
            raise _End(1)
        self.inbuf += data

    def readline(self):
        """The next command line without its LF, or None if it was too long."""
        scanned = 0
        too_long = False
        while True:
            nl = self.inbuf.find(b"\n", scanned)
            if nl >= 0:
                line = bytes(self.inbuf[:nl])
                del self.inbuf[:nl + 1]
                return None if too_long or len(line) > MAX_COMMAND else line
            if len(self.inbuf) > MAX_COMMAND:
                too_long = True
                self.inbuf.clear()
            scanned = len(self.inbuf)
            self.fill()

    # -- the dialogue ----------------------------------------------------
    def run(self):
        try:
            try:
                self.cfg = SmtpdConfig(self.home, self.environ)
            except SetupError:
                raise _End(1, R_CONTROLS)
            if self.cfg.session_deadline:
                self.until = time.monotonic() + self.cfg.session_deadline
            self.out += b"220 " + self.cfg.greeting + b" ESMTP\r\n"
            while True:
                line = self.readline()
                if line is None:
                    self.out += R_TOO_LONG
                    continue
                self.command(line)
        except _End as end:
            if end.reply:
                self.out += end.reply
            # the last reply after a deadline gets a short grace, else timeoutsmtpd
            self.until = time.monotonic() + DEADLINE_GRACE if end.deadline else None
            if self.out:
                try:
                    self.flush()
                except _End:
                    pass
            return end.code

    def command(self, line):
        if line.endswith(b"\r"):
            line = line[:-1]
        nul = line.find(b"\0")
        if nul >= 0:
            line = line[:nul]                 # qmail handles commands as C strings
        space = line.find(b" ")
        if space < 0:
            verb, arg = line, b""
        else:
            verb, arg = line[:space], line[space:].lstrip(b" ")
        handler = _COMMANDS.get(verb.lower(), Session.unimplemented)
        handler(self, arg)

    def unimplemented(self, arg):
        self.out += R_UNIMPL

    def greet(self, code):
        self.out += code + self.cfg.greeting

    def dohelo(self, arg):
        self.fakehelo = None if arg.lower() == self.cfg.remotehost.lower() else arg

    def helo(self, arg):
        self.greet(b"250 ")
        self.out += b"\r\n"
        self.seenmail = False
        self.dohelo(arg)

    def ehlo(self, arg):
        self.greet(b"250-")
        size = b"250-SIZE %d\r\n" % self.cfg.databytes if self.cfg.databytes else b"250-SIZE\r\n"
        self.out += b"\r\n250-PIPELINING\r\n" + size + b"250 8BITMIME\r\n"
        self.seenmail = False
        self.dohelo(arg)

    def quit(self, arg):
        self.greet(b"221 ")
        self.out += b"\r\n"
        raise _End(0)

    def rset(self, arg):
        self.seenmail = False
        self.out += R_FLUSHED

    def noop(self, arg):
        self.out += R_OK

    def vrfy(self, arg):
        self.out += R_VRFY

    def help(self, arg):
        self.out += R_HELP

    def is_local_ip(self, ip):
        if self._local_ips is None:
            from qmailpy.smtpd.ipme import local_ipv4_addresses
            try:
                self._local_ips = local_ipv4_addresses()
            except OSError:
                raise _End(1, R_IPME)
        return ip in self._local_ips

    def parse_address(self, arg):
        addr, rest = addrparse(arg)
        if self.cfg.liphost is not None:
            addr = localiphost_rewrite(addr, self.cfg.liphost, self.is_local_ip)
        if len(addr) > MAX_ADDRESS:
            return None, rest
        return addr, rest

    def mail(self, arg):
        addr, rest = self.parse_address(arg)
        if addr is None:
            self.out += R_SYNTAX
            return
        size = size_parameter(rest)
        if size is not None and self.cfg.databytes and size > self.cfg.databytes:
            # A refused MAIL ends the open transaction: a pipelining client's next
            # RCPTs and DATA must not join the previous envelope.
            self.seenmail = False
            self.rcpt = []
            self.out += R_SIZE
            return
        self.flagbarf = badmailfrom(addr, self.cfg.badmailfrom)
        self.seenmail = True
        self.rcpt = []
        self.mailfrom = addr
        self.out += R_OK

    def rcpt_(self, arg):
        if not self.seenmail:
            self.out += R_MAIL_FIRST
            return
        addr, _ = self.parse_address(arg)
        if addr is None:
            self.out += R_SYNTAX
            return
        if self.flagbarf:
            self.out += R_BADMAILFROM
            return
        if self.cfg.maxrcpt and len(self.rcpt) >= self.cfg.maxrcpt:
            self.out += R_MAXRCPT
            return
        if self.cfg.relayclient is not None:
            addr += self.cfg.relayclient
        else:
            try:
                allowed = rcpt_allowed(addr, self.cfg.rcpthosts, self.cfg.more_lookup())
            except SetupError:
                raise _End(1, R_CONTROLS)
            if not allowed:
                self.out += R_NOGATEWAY
                return
        self.rcpt.append(addr)
        self.out += R_OK

    def data(self, arg):
        if not self.seenmail:
            self.out += R_MAIL_FIRST
            return
        if not self.rcpt:
            self.out += R_RCPT_FIRST
            return
        self.seenmail = False
        try:
            if self._queue_client is not None:
                qq = self._queue_client(self.home, self.environ)
            else:
                from qmailpy.queue.client import QueueClient
                qq = QueueClient(self.home, self.environ)
        except OSError:
            self.out += R_QQT
            return
        cfg = self.cfg
        self.out += R_GO_AHEAD
        session_until = self.until
        if cfg.data_deadline:
            # counted from the 354; the reply goes out with the first read
            data_until = time.monotonic() + cfg.data_deadline
            self.until = data_until if session_until is None else min(session_until, data_until)
        try:
            qq.write(received_line(cfg.remotehost, self.fakehelo, cfg.remoteinfo,
                                   cfg.remoteip, cfg.localhost))
            reader = DataReader(qq.write, cfg.databytes)
            while True:
                if self.inbuf:
                    consumed = reader.feed(bytes(self.inbuf))
                    del self.inbuf[:consumed]
                    if reader.done:
                        break
                self.fill()
        except StrayNewline:
            qq.abort()
            raise _End(1, R_SMTPLF)
        except BaseException:
            qq.abort()
            raise
        self.until = session_until
        if reader.hops >= MAX_HOPS:
            qq.abort()
            self.out += R_HOPS
            return
        if reader.overflow:
            qq.abort()
            self.out += R_SIZE
            return
        result = qq.finish(self.mailfrom, self.rcpt)
        if result.ok:
            self.out += b"250 ok %d qp %d\r\n" % (int(time.time()), result.pid)
        else:
            self.out += (b"554 " if result.permanent else b"451 ") + result.text + b"\r\n"


_COMMANDS = {
    b"helo": Session.helo, b"ehlo": Session.ehlo, b"mail": Session.mail,
    b"rcpt": Session.rcpt_, b"data": Session.data, b"rset": Session.rset,
    b"noop": Session.noop, b"vrfy": Session.vrfy, b"help": Session.help,
    b"quit": Session.quit,
}


def serve(home, environ=None, in_fd=0, out_fd=1):
    """Run one session; the exit status qmail-smtpd would have."""
    return Session(home, environ, in_fd, out_fd).run()
