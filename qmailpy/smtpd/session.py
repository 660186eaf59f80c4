"""One qmail-smtpd session on a pair of file descriptors (docs/submission.md "qmail-smtpd").

Replies are buffered and flushed just before the next read, as qmail's
substdio does, so a pipelining client gets one write per batch. Every read and
write is bounded by timeoutsmtpd; a read timeout is answered with 451, a write
timeout or EOF ends the session silently. Not in qmail: the whole session
(timeoutsmtpdsession) and each DATA (timeoutsmtpddata) have deadlines, so a
client that keeps every single wait short (one byte a second) is still cut off,
with the same 451; a DATA cut off queues nothing.

After STARTTLS (tls.py) every read and write goes through the TLS connection;
AUTH (auth.py) is offered inside it when SMTPAUTH is set.
"""
import os
import select
import time

from qmailpy.home import ControlError, control_value
from qmailpy.queuelimits import EnvelopeBudget
from qmailpy.smtpd.address import (MAX_ADDRESS, addrparse, badmailfrom, localiphost_rewrite,
                                   rcpt_allowed, size_parameter, smtputf8_parameter)
from qmailpy.smtpd.config import SetupError, SmtpdConfig
from qmailpy.smtpd.data import MAX_HOPS, DataReader, StrayNewline
from qmailpy.smtpd.received import received_line
from qmailpy.smtpd.received import safe as received_safe

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
R_INTERNAL = b"451 internal error, closing connection (#4.3.0)\r\n"    # a bug: traceback on fd 2
R_HOPS = b"554 too many hops, this message is looping (#5.4.6)\r\n"
R_SIZE = b"552 sorry, that message size exceeds my databytes limit (#5.3.4)\r\n"
R_FLUSHED = b"250 flushed\r\n"
R_VRFY = b"252 send some mail, i'll try my best\r\n"
R_HELP = b"214 qmail home page: http://pobox.com/~djb/qmail.html\r\n"
R_UNIMPL = b"502 unimplemented (#5.5.1)\r\n"
R_TIMEOUT = b"451 timeout (#4.4.2)\r\n"
R_SMTPLF = b"451 See https://cr.yp.to/docs/smtplf.html.\r\n"
R_TOO_LONG = b"500 command line too long (#5.5.2)\r\n"
R_TLS_READY = b"220 ready for tls\r\n"
R_TLS_UNAVAILABLE = b"454 TLS not available due to temporary reason (#4.3.0)\r\n"
R_TLS_ARGUMENT = b"501 Syntax error (no parameters allowed) (#5.5.4)\r\n"
R_AUTH_OK = b"235 ok, go ahead (#2.0.0)\r\n"
R_AUTH_NEEDS_TLS = b"538 encryption required for requested authentication mechanism (#5.7.11)\r\n"
R_AUTH_REQUIRED = b"530 authentication required (#5.7.0)\r\n"
R_AUTH_AGAIN = b"503 you're already authenticated (#5.5.0)\r\n"
R_AUTH_IN_MAIL = b"503 no auth during mail transaction (#5.5.0)\r\n"
R_AUTH_MECHANISM = b"504 unrecognized authentication type (#5.5.4)\r\n"
R_AUTH_MALFORMED = b"501 malformed auth input (#5.5.4)\r\n"
R_AUTH_CANCELLED = b"501 auth exchange cancelled (#5.0.0)\r\n"
R_AUTH_FAILED = b"535 authentication failed (#5.7.8)\r\n"
R_AUTH_TEMPORARY = b"454 temporary authentication failure (#4.7.0)\r\n"
R_AUTH_TOO_MANY = b"421 too many authentication failures (#4.7.0)\r\n"

# After a deadline, the 451 gets this long to go out to a client that does not read.
DEADLINE_GRACE = 5


class _End(Exception):
    """The session is over; .code is the exit status, .reply a last reply or None."""

    def __init__(self, code, reply=None, deadline=False):
        self.code, self.reply, self.deadline = code, reply, deadline


class Session:
    def __init__(self, home, environ=None, in_fd=0, out_fd=1):
        self.home = home
        self.environ = os.environ if environ is None else environ
        self.in_fd, self.out_fd = in_fd, out_fd
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
        self.tls = None             # the TLS connection after STARTTLS
        self._can_tls = None
        self.smtputf8 = False       # MAIL FROM had the SMTPUTF8 parameter
        self.hold_until = None      # MAIL FROM's HOLDFOR/HOLDUNTIL, epoch seconds
        self.authenticated = None   # the user name after a successful AUTH
        self.dnsbl = None           # (reply, log text) while the client is listed (smtpd/dnsbl.py)
        self.milters = None         # qmailpy.milter.filters.Milters with control/milters
        self.checks = None          # smtpd/authcheck.py's Checks with control/authcheck
        self.helohost = b""         # the HELO/EHLO argument (SPF's identity for MAIL FROM <>)
        self.auth_failures = 0
        self._checkpassword = None
        self._in_poll = select.poll()       # one per direction for the whole session
        self._in_poll.register(in_fd, select.POLLIN)
        self._out_poll = select.poll()
        self._out_poll.register(out_fd, select.POLLOUT)

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
        if self.tls is not None:
            return self._flush_tls()
        view = memoryview(self.out)
        poller = self._out_poll
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

    def _flush_tls(self):
        try:
            wait = self._wait_ms()
            if not wait:
                raise _End(1)
            self.tls.settimeout(wait / 1000)
            self.tls.sendall(self.out)
        except OSError:                 # ssl errors and timeouts too
            raise _End(1)
        finally:
            self.out.clear()

    def fill(self):
        """Flush replies, then wait (timeoutsmtpd) for more input; EOF ends the session."""
        if self.until is not None and time.monotonic() >= self.until:
            raise _End(1, R_TIMEOUT, deadline=True)
        if self.out:
            self.flush()
        data = self._read_tls() if self.tls is not None else self._read()
        if not data:
            raise _End(1)
        self.inbuf += data

    def _timed_out(self):
        return _End(1, R_TIMEOUT, deadline=self.until is not None and time.monotonic() >= self.until)

    def _read(self):
        poller = self._in_poll
        wait = self._wait_ms()
        if not wait or not poller.poll(wait):
            raise self._timed_out()
        try:
            return os.read(self.in_fd, READ_SIZE)
        except OSError:
            raise _End(1)

    def _read_tls(self):
        if not self.tls.pending():
            wait = self._wait_ms()
            if not wait:
                raise self._timed_out()
            self.tls.settimeout(wait / 1000)
        try:
            return self.tls.recv(READ_SIZE)
        except TimeoutError:
            raise self._timed_out()
        except OSError:
            raise _End(1)

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
            self.dnsbl = _dnsbl(self.home, self.cfg)
            self.checks = _authcheck(self.home)
            self.milters = _milters(self.home, self.cfg, self.environ)
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
        if self.dnsbl is not None and self.authenticated is None:
            from qmailpy.smtpd.dnsbl import ALLOWED
            if verb.lower() not in ALLOWED:
                self.out += self.dnsbl[0]
                return
        if self.milters is not None and self.milters.refusal and verb.lower() != b"quit":
            self.out += self.milters.refusal
            return
        handler = _COMMANDS.get(verb.lower(), Session.unimplemented)
        handler(self, arg)

    def unimplemented(self, arg):
        self.out += R_UNIMPL

    def greet(self, code):
        self.out += code + self.cfg.greeting

    def dohelo(self, arg):
        self.fakehelo = None if arg.lower() == self.cfg.remotehost.lower() else arg
        self.helohost = arg

    def milter_refuses(self, step, *args):
        """A milter's reply to this step (queued for the client), or None to go on."""
        reply = getattr(self.milters, step)(*args) if self.milters is not None else None
        if reply is not None:
            self.out += reply
        return reply is not None

    def tls_macros(self):
        """(version, cipher) for the milters' {tls_version} and {cipher}, or None in clear."""
        if self.tls is None:
            return None
        return self.tls.version().encode(), self.tls.cipher()[0].encode()

    def helo(self, arg):
        if self.milter_refuses("helo", arg, self.tls_macros()):
            return
        self.greet(b"250 ")
        self.out += b"\r\n"
        self.seenmail = False
        self.dohelo(arg)

    def ehlo(self, arg):
        if self.milter_refuses("helo", arg, self.tls_macros()):
            return
        self.greet(b"250-")
        size = b"250-SIZE %d\r\n" % self.cfg.databytes if self.cfg.databytes else b"250-SIZE\r\n"
        self.out += b"\r\n250-PIPELINING\r\n" + size
        if self.tls is None and self.can_tls():
            self.out += b"250-STARTTLS\r\n"
        if self.tls is not None and self.auth_offered():
            from qmailpy.smtpd.auth import MECHANISMS
            self.out += b"250-AUTH " + MECHANISMS + b"\r\n"
        if self.hold_reaches_queue() and (self.cfg.relayclient is not None
                                          or (self.tls is not None and self.auth_offered())):
            from qmailpy.smtpd.futurerelease import keyword     # (holds after AUTH too)
            self.out += b"250-" + keyword(time.time()) + b"\r\n"
        self.out += b"250-SMTPUTF8\r\n250 8BITMIME\r\n"
        self.seenmail = False
        self.dohelo(arg)

    def hold_reaches_queue(self):
        """FUTURERELEASE only where the hold reaches the queue: not through a $QMAILQUEUE
        program, which may not read $QMAILNOTBEFORE."""
        return "QMAILQUEUE" not in self.environ

    # -- STARTTLS and AUTH -------------------------------------------------
    def can_tls(self):
        if self._can_tls is None:
            from qmailpy.smtpd.tls import can_offer
            self._can_tls = can_offer(self.home, self.in_fd)
        return self._can_tls

    def starttls(self, arg):
        if self.tls is not None or not self.can_tls():
            self.out += R_UNIMPL
            return
        if arg:
            self.out += R_TLS_ARGUMENT
            return
        from qmailpy.smtpd import tls
        try:
            context = tls.server_context(self.home)
            timeout = tls.handshake_timeout(self.home)
        except (tls.TlsUnavailable, ControlError):
            self.out += R_TLS_UNAVAILABLE
            return
        self.out += R_TLS_READY
        # Commands pipelined behind STARTTLS arrived in clear: they must not run
        # inside the TLS session (the CVE-2011-0411 command injection).
        self.inbuf.clear()
        self.flush()
        if self.until is not None:
            timeout = max(0.001, min(timeout, self.until - time.monotonic()))
        conn = tls.handshake(context, self.in_fd, timeout)
        if conn is None:
            raise _End(1)
        self.tls = conn
        # RFC 3207: nothing learnt before the handshake is kept
        self.seenmail = False
        self.rcpt = []
        self.mailfrom = b""
        self.fakehelo = None
        self.smtputf8 = False

    def auth_offered(self):
        if self.cfg.smtpauth is None:
            return False
        if self._checkpassword is None:
            from qmailpy.smtpd.auth import checkpassword_argv
            try:
                self._checkpassword = checkpassword_argv(self.home) or ()
            except ControlError:
                raise _End(1, R_CONTROLS)
        return bool(self._checkpassword)

    def auth(self, arg):
        if not self.auth_offered():
            self.out += R_UNIMPL
            return
        if self.tls is None:
            self.out += R_AUTH_NEEDS_TLS
            return
        if self.authenticated is not None:
            self.out += R_AUTH_AGAIN
            return
        if self.seenmail:
            self.out += R_AUTH_IN_MAIL
            return
        from qmailpy.smtpd import auth
        mechanism, _, initial = arg.partition(b" ")
        mechanism = mechanism.upper()
        try:
            if mechanism == b"PLAIN":
                user, password = auth.plain_credentials(initial or self.challenge(b""))
            elif mechanism == b"LOGIN":
                user = auth.decode(initial or self.challenge(b"VXNlcm5hbWU6"))  # Username:
                password = auth.decode(self.challenge(b"UGFzc3dvcmQ6"))           # Password:
                if not user:
                    raise auth.Malformed()
            else:
                self.out += R_AUTH_MECHANISM
                return
        except auth.Malformed:
            self.out += R_AUTH_MALFORMED
            return
        except _Cancelled:
            self.out += R_AUTH_CANCELLED
            return
        try:
            timeout = auth.checkpassword_timeout(self.home)
        except ControlError:
            raise _End(1, R_CONTROLS)
        verdict = auth.check(list(self._checkpassword), user, password, timeout, self.environ)
        who = b"%s from %s" % (received_safe(user), self.cfg.remoteip)
        if verdict == auth.OK:
            self.authenticated = user
            if self.cfg.relayclient is None:
                self.cfg.relayclient = b""
            log(b"auth ok: " + who)
            self.out += R_AUTH_OK
        elif verdict == auth.TEMPORARY:
            log(b"auth temporary failure: " + who)
            self.out += R_AUTH_TEMPORARY
        else:
            self.auth_failures += 1
            log(b"auth failed: " + who)
            # every wrong guess costs a second of a session slot, the last one too: a
            # client that reconnects after the 421 has not saved a wait
            time.sleep(auth.FAIL_DELAY)
            if self.auth_failures >= auth.MAX_FAILURES:
                raise _End(1, R_AUTH_TOO_MANY)
            self.out += R_AUTH_FAILED

    def challenge(self, prompt):
        """Send 334 prompt; the client's answer (a line), or _Cancelled for "*"."""
        self.out += b"334 " + prompt + b"\r\n"
        line = self.readline()
        if line is None:
            from qmailpy.smtpd.auth import Malformed
            raise Malformed()
        if line.endswith(b"\r"):
            line = line[:-1]
        if line == b"*":
            raise _Cancelled()
        return line

    def quit(self, arg):
        self.greet(b"221 ")
        self.out += b"\r\n"
        raise _End(0)

    def rset(self, arg):
        if self.milters is not None:
            self.milters.abort()
        self.seenmail = False
        self.smtputf8 = False
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
        if self.cfg.auth_required and self.authenticated is None:
            self.out += R_AUTH_REQUIRED
            return
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
        hold_until = None
        if b"HOLD" in rest.upper():
            from qmailpy.smtpd.futurerelease import Refused, hold_parameter
            try:
                hold_until = hold_parameter(rest, time.time(), self.cfg.relayclient is not None,
                                            self.hold_reaches_queue())
            except Refused as e:
                self.seenmail = False
                self.rcpt = []
                self.out += e.reply
                return
        if self.checks is not None and self.cfg.relayclient is None:
            refused = self.checks.at_mail(self.cfg.remoteip, addr, self.helohost)
            if refused is not None:
                self.seenmail = False
                self.rcpt = []
                log(b"authcheck: " + self.checks.log)
                self.out += refused
                return
        if self.milter_refuses("mail", addr, rest, self.authenticated):
            self.seenmail = False
            return
        self.hold_until = hold_until
        self.flagbarf = badmailfrom(addr, self.cfg.badmailfrom)
        self.smtputf8 = smtputf8_parameter(rest)
        self.seenmail = True
        self.rcpt = []
        self.rcpt_budget = EnvelopeBudget(self.cfg.maxrcpt)    # RCPTs come only after this
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
        if not self.rcpt_budget.admit(len(addr)):
            self.out += R_MAXRCPT              # control/maxrcpt or the queue's envelope bound
            return
        if self.milter_refuses("rcpt", addr):
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
        if self.milter_refuses("data"):
            self.milters.abort()
            return
        checks = self.checks            # (a relay client's message: forged results removed only)
        if self.milters is not None or checks is not None:
            from qmailpy.queue.spool import Spool
            qq = Spool()                # the checks and milters see it before the queue does
        else:
            try:
                qq = self.queue_client()
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
                                   cfg.remoteip, cfg.localhost, protocol=self.protocol()))
            reader = DataReader(qq.write, cfg.databytes)
            while True:
                if self.inbuf:
                    consumed = reader.feed(bytes(self.inbuf))
                    del self.inbuf[:consumed]
                    if reader.done:
                        break
                self.fill()
        except StrayNewline:
            _give_up(qq, self.milters)
            raise _End(1, R_SMTPLF)
        except BaseException:
            _give_up(qq, self.milters)
            raise
        self.until = session_until
        if reader.hops >= MAX_HOPS:
            _give_up(qq, self.milters)
            self.out += R_HOPS
            return
        if reader.overflow:
            _give_up(qq, self.milters)
            self.out += R_SIZE
            return
        self.smtputf8 = False
        if checks is not None:
            qq = self.authenticate(qq, checks)
            if qq is None:
                return
        if self.milters is not None:
            try:
                self.out += self.milters.end_of_data(qq, self.mailfrom, self.rcpt, self.queue)
            finally:
                qq.close()
            return
        self.out += self.queued(qq.finish(self.mailfrom, self.rcpt))

    def authenticate(self, spool, checks):
        """smtpd/authcheck.py's checks of the spooled message: its reply queued and None, or a
        spool the milters see next (the message queued and None when there are none)."""
        try:
            refused, write = checks.after_data(spool, checked=self.cfg.relayclient is None)
            if refused is not None:
                if checks.log:
                    log(b"authcheck: " + checks.log)
                _give_up(spool, self.milters)
                self.out += refused
                return None
            if self.milters is None:
                self.out += self.queue(write, self.mailfrom, self.rcpt)
                return None
            from qmailpy.queue.spool import Spool
            annotated = Spool()
            write(annotated.write)
            if annotated.error is not None:
                raise annotated.error
            return annotated
        except OSError:             # the spool could not be read back or written
            from qmailpy.smtpd.authcheck import R_SPOOL
            _give_up(spool, self.milters)
            self.out += R_SPOOL
            return None
        finally:
            spool.close()

    def queue_client(self, hold=False):
        from qmailpy.queue.client import QueueClient
        return QueueClient(self.home, self.environ, prefer_server=True, not_before=self.hold_until,
                           hold=hold)

    def queue(self, write, sender, recipients, hold=False):
        """The reply to queueing what write(sink) puts out (the milters' path); hold: queued
        on hold (a milter's quarantine), or 451 where the hold cannot reach the queue."""
        if hold:
            from qmailpy.queue.client import hold_reaches_queue
            if not hold_reaches_queue(self.home, self.environ):
                from qmailpy.milter.filters import R_QUARANTINE
                return R_QUARANTINE
        try:
            qq = self.queue_client(hold)
        except OSError:
            return R_QQT
        try:
            write(qq.write)
        except BaseException:
            qq.abort()
            raise
        return self.queued(qq.finish(sender, recipients))

    def queued(self, result):
        if result.ok:
            return b"250 ok %d qp %d\r\n" % (int(time.time()), result.pid)
        return (b"554 " if result.permanent else b"451 ") + result.text + b"\r\n"


    def protocol(self):
        """The Received line's "with" word: UTF8SMTP for an SMTPUTF8 transaction (RFC 6531),
        and the TLS version and cipher in TLS."""
        word = b"UTF8SMTP" if self.smtputf8 else b"SMTP"
        if self.tls is None:
            return word
        from qmailpy.smtpd.tls import protocol
        return protocol(self.tls, word)


class _Cancelled(Exception):
    """The client answered a 334 with "*"."""


def _dnsbl(home, cfg):
    """smtpd/dnsbl.py's verdict on the client, logged when it is listed (docs/submission.md "DNSBLs")."""
    if cfg.relayclient is not None or not os.path.exists(os.path.join(home, "control", "dnsbl")):
        return None
    from qmailpy.smtpd import dnsbl
    try:
        listed = dnsbl.at_connect(home, cfg)
    except ControlError:
        raise _End(1, R_CONTROLS) from None
    if listed is not None:
        log(b"dnsbl: " + listed[1])
    return listed


def _authcheck(home):
    """smtpd/authcheck.py's Checks when control/authcheck exists (docs/submission.md
    "Sender authentication"), else None, importing nothing."""
    if not os.path.exists(os.path.join(home, "control", "authcheck")):
        return None
    from qmailpy.smtpd import authcheck
    try:
        return authcheck.Checks(home)
    except ControlError:
        raise _End(1, R_CONTROLS) from None


def _give_up(qq, milters):
    """A message that will not be queued: its queue client or spool, and the milters' view."""
    if milters is None and hasattr(qq, "abort"):
        qq.abort()
    else:
        qq.close()
    if milters is not None:
        milters.abort()


def _milters(home, cfg, environ):
    """The session's milters from control/milters, connected and told of the client, or None."""
    if not os.path.exists(os.path.join(home, "control", "milters")):
        return None
    from qmailpy.milter import config
    try:
        specs = config.read(home)
    except ControlError:
        raise _End(1, R_CONTROLS) from None
    if not specs:
        return None
    from qmailpy.milter.filters import Milters
    me = control_value(home, "me") or b"unknown"

    def env(name):
        return os.fsencode(environ.get(name, "")) or b"unknown"
    milters = Milters(specs, {"me": me, "remoteip": cfg.remoteip, "remotehost": cfg.remotehost,
                              "remoteport": env("TCPREMOTEPORT"), "localip": env("TCPLOCALIP"),
                              "localport": env("TCPLOCALPORT")}, log)
    milters.connect()
    return milters


def log(line):
    try:
        os.write(2, b"qmail-smtpd: " + line + b"\n")
    except OSError:
        pass


_COMMANDS = {
    b"helo": Session.helo, b"ehlo": Session.ehlo, b"mail": Session.mail,
    b"rcpt": Session.rcpt_, b"data": Session.data, b"rset": Session.rset,
    b"noop": Session.noop, b"vrfy": Session.vrfy, b"help": Session.help,
    b"quit": Session.quit, b"starttls": Session.starttls, b"auth": Session.auth,
}


def _internal_error(session, exc):
    """A bug in the session: its traceback on stderr (the listener's log), a 451 to the
    client (the mail stays with it), the session ended (docs/submission.md)."""
    from qmailpy import internalerror
    internalerror.log("qmail-smtpd", exc)
    session.until = time.monotonic() + DEADLINE_GRACE
    # The replies to commands before the bug stand: a pipelined client must still see the
    # 250 of a message already queued, or it sends it again. A reply cut short does not.
    del session.out[session.out.rfind(b"\n") + 1:]
    session.out += R_INTERNAL
    try:
        session.flush()
    except Exception:           # _End: the client is gone, or the bug is in flush itself
        pass
    return 1


def serve(home, environ=None, in_fd=0, out_fd=1):
    """Run one session; the exit status qmail-smtpd would have."""
    session = Session(home, environ, in_fd, out_fd)
    try:
        return session.run()
    except Exception as e:
        return _internal_error(session, e)
    finally:
        # In a session worker the process lives on: the TLS connection's own copy of the
        # socket must close now, or the client would not see the session end.
        if session.tls is not None:
            try:
                session.tls.close()
            except OSError:
                pass
        if session.milters is not None:
            session.milters.close()
