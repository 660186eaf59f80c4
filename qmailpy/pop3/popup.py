"""qmail-popup HOST subprogram...: the POP3 authorization state (qmail-popup(8);
docs/protocols.md "checkpassword").

The greeting is +OK <PID.TIME@HOST>. USER and PASS (or APOP name digest) run the
subprogram, a checkpassword program, with the connection on fds 0, 1 and 2 and
name\\0password\\0<PID.TIME@HOST>\\0 on fd 3 (for APOP the digest is the password
and the timestamp is what was hashed). It checks the password, becomes the user and
runs its arguments (qmail-pop3d Maildir). Its failure is answered "-ERR
authorization failed" and ends the session; qmail-popup ends when it does, exit 1.

Beyond qmail: CAPA (RFC 2449); STLS (RFC 2595) when control/servercert.pem is
readable and the connection is a socket, after which this process relays between
the TLS connection and a socket pair that the rest of the session (checkpassword,
qmail-pop3d) has as its fds 0 and 1; and control/pop3requiretls: when it holds 1,
USER, PASS and APOP from a client that is not on a loopback address
($TCPREMOTEIP) are refused until STLS.
"""
import os
import signal
import time

from qmailpy.pop3.conn import TIMEOUT, Closed, Conn

REQUIRE_TLS = "pop3requiretls"
R_USAGE = b"usage: popup hostname subprogram"
R_STLS_FIRST = b"use STLS first"
R_TLS_READY = b"+OK begin TLS negotiation\r\n"
R_TLS_UNAVAILABLE = b"TLS not available"


def is_loopback(ip):
    if ip.startswith("::ffff:"):
        ip = ip[7:]
    return ip.startswith("127.") or ip == "::1"


class Popup:
    def __init__(self, conn, home, hostname, childargs, environ):
        self.conn = conn
        self.home = home
        self.hostname = hostname
        self.childargs = childargs
        self.environ = environ
        self.unique = b"%d.%d@" % (os.getpid(), int(time.time()))
        self.username = None
        self.tls = False
        from qmailpy.home import control_int
        self.require_tls = (control_int(home, REQUIRE_TLS, 0) == 1
                            and not is_loopback(environ.get("TCPREMOTEIP", "")))

    def stls_offered(self):
        if self.tls:
            return False
        from qmailpy.smtpd import tls
        return tls.can_offer(self.home, self.conn.rfd)

    def _refused_in_clear(self):
        if self.require_tls and not self.tls:
            self.conn.err(R_STLS_FIRST)
            return True
        return False

    def user(self, arg):
        if self._refused_in_clear():
            return
        if not arg:
            self.conn.err(b"syntax error")
            return
        self.conn.okay()
        self.username = arg

    def pass_(self, arg):
        if self._refused_in_clear():
            return
        if self.username is None:
            self.conn.err(b"USER first")
            return
        if not arg:
            self.conn.err(b"syntax error")
            return
        self.do_and_die(self.username, arg)

    def apop(self, arg):
        if self._refused_in_clear():
            return
        name, space, digest = arg.partition(b" ")
        if not space:
            self.conn.err(b"syntax error")
            return
        self.do_and_die(name, digest)

    def quit(self, arg):
        self.conn.okay()
        raise Closed()

    def noop(self, arg):
        self.conn.okay()

    def capa(self, arg):
        lines = [b"+OK capability list follows", b"TOP", b"UIDL"]
        if not (self.require_tls and not self.tls):
            lines.append(b"USER")
        if self.stls_offered():
            lines.append(b"STLS")
        self.conn.reply(b"\r\n".join(lines) + b"\r\n.\r\n")

    def stls(self, arg):
        if not self.stls_offered():
            self.conn.err(R_TLS_UNAVAILABLE)
            return
        from qmailpy.smtpd import tls
        try:
            context = tls.server_context(self.home)
        except tls.TlsUnavailable:
            self.conn.err(R_TLS_UNAVAILABLE)
            return
        self.conn.reply(R_TLS_READY)
        # Commands pipelined behind STLS arrived in clear: they must not run inside TLS.
        self.conn.discard_pending()
        secure = tls.handshake(context, self.conn.rfd, TIMEOUT)
        if secure is None:
            raise Closed()
        from qmailpy.pop3.tlsrelay import split
        split(secure)           # returns only in the process that goes on with the session
        self.tls = True
        self.username = None

    def do_and_die(self, user, password):
        """Run the subprogram with the credentials on fd 3; its failure ends the session."""
        if b"\0" in user or b"\0" in password:
            self.conn.err(b"authorization failed")
            raise Closed()
        os.dup2(1, 2)
        try:
            os.close(3)
        except OSError:
            pass
        r, w = os.pipe()
        if r != 3:
            os.dup2(r, 3)
            os.close(r)
        else:
            os.set_inheritable(3, True)
        try:
            pid = os.posix_spawnp(self.childargs[0], self.childargs, self.environ,
                                  file_actions=[(os.POSIX_SPAWN_CLOSE, w)],
                                  setsigdef=(signal.SIGPIPE,))     # as qmail's sig_pipedefault()
        except OSError:
            pid = None
        os.close(3)
        try:
            if pid is not None:
                os.write(w, user + b"\0" + password + b"\0<" + self.unique
                         + self.hostname + b">\0")
        except OSError:         # it exited without reading
            pass
        os.close(w)
        if pid is None:
            self.conn.err(b"authorization failed")
            raise Closed()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            self.conn.err(b"aack, child crashed")
        elif os.waitstatus_to_exitcode(status):
            self.conn.err(b"authorization failed")
        raise Closed()

    COMMANDS = {b"user": user, b"pass": pass_, b"apop": apop, b"quit": quit, b"noop": noop,
                b"capa": capa, b"stls": stls}

    def run(self):
        self.conn.reply(b"+OK <" + self.unique + self.hostname + b">\r\n")
        self.conn.serve(self, self.COMMANDS, b"authorization first")


def main(argv, environ):
    from qmailpy.home import ControlError, qmail_home
    conn = Conn()
    try:
        if len(argv) < 2 or not argv[0]:
            conn.err(R_USAGE)
            return 1
        try:
            popup = Popup(conn, qmail_home(), os.fsencode(argv[0]), argv[1:], environ)
        except ControlError:
            conn.err(b"unable to read controls")
            return 1
        popup.run()
    except Closed:
        pass
    return 1
