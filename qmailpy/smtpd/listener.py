"""A TCP listener for qmail-smtpd (what tcpserver does for qmail), with session workers.

The listener hands each connection to a session worker (qmailpy.workerserver): a
process forked from the listener once, with no exec, that serves one session at a
time and up to max_use sessions in its life. For each session the worker sets the
tcpserver environment (PROTO=TCP, TCPREMOTEIP/PORT, TCPLOCALIP/PORT, TCPLOCALHOST),
puts the connection on fds 0 and 1 and runs the session code; afterwards fds 0
and 1 point at /dev/null again, so nothing of one session reaches the next. So a
connection costs neither an interpreter start nor a fork. At most `limit`
sessions run at once; further connections wait in the kernel's backlog. SIGTERM
(or SIGINT) closes the listening socket and ends the listener; sessions in
progress finish on their own, then their workers exit.

Rules (tcprules' source format, qmailpy.clientrules) decide per client address whether a
connection is refused before any session runs or which variables its session
gets, as tcpserver -x does.

Not in tcpserver: at most `per_source` sessions run at once for one client
address (an IPv4 client of a dual-stack socket counted by its IPv4 address); a
connection beyond that is answered PER_SOURCE_REPLY and closed before it reaches a
worker, so one client cannot take every session slot.
"""
import os
import socket

from qmailpy.util.environ import replace as replace_environ
from qmailpy.workerserver import DEFAULT_MAX_IDLE, DEFAULT_MAX_USE, REFUSED, WorkerServer
from qmailpy.smtpd.tcpenv import unmapped

PER_SOURCE_REPLY = b"421 too many connections from your address (#4.3.2)\r\n"


class Listener(WorkerServer):
    def __init__(self, host, port, handler, limit=40, local_host=None, environ=None,
                 rules=None, warn=None, per_source=None, setup=None,
                 max_use=DEFAULT_MAX_USE, max_idle=DEFAULT_MAX_IDLE):
        """handler(environ) -> exit status, run in a worker with fds 0/1 connected.

        setup(): run once in each new worker before its first session (to give up
        root); an exception there ends that worker.

        rules: a Rules object consulted for each connection; warn(text) is told when
        a changed rules file cannot be used (the previous rules stay in force).
        per_source: the most sessions one client address may have at once (half of
        limit, rounded up, when None); one beyond is answered PER_SOURCE_REPLY at once.
        """
        self.handler = handler
        self.setup = setup
        self.rules = rules
        self.warn = warn
        self.local_host = local_host
        self.environ = dict(os.environ if environ is None else environ)
        self._installed = None          # in a worker: the environment its last session had
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.address = self.sock.getsockname()[:2]
        super().__init__([self.sock], limit, max_use, max_idle, per_client=per_source)

    def admit(self, sock, conn, remote):
        """The client's rule variables, or REFUSED (checked before a worker is involved: a
        denied client costs none). An IPv4 client of a dual-stack socket is matched by its
        IPv4 address, as tcpserver names it."""
        ip = unmapped(remote[0])
        allow, variables = self._rule_for(ip)
        if not allow:
            return REFUSED
        return ip, variables

    def client_of(self, context):
        return context[0]

    def too_many(self, conn, context):
        try:        # a fresh socket's buffer takes it; never wait for this client
            conn.send(PER_SOURCE_REPLY, socket.MSG_DONTWAIT)
        except OSError:
            pass

    def worker_started(self):
        _release_connection()       # the listener's own fds 0 and 1 are not a session's
        if self.setup is not None:
            self.setup()

    def child(self, sock_index, conn, context):
        return self._child(conn, conn.getpeername(), context[1])

    def let_go(self):
        _release_connection()

    def _rule_for(self, ip):
        """(allow, variables) for a client; checked in the listener so a denied one costs no worker."""
        if self.rules is None:
            return True, ()
        error = self.rules.refresh()
        if error is not None and self.warn is not None:
            self.warn(error)
        return self.rules.lookup(ip)

    def _child(self, conn, remote, variables):
        local = conn.getsockname()
        env = dict(self.environ)            # each session starts from the listener's environment
        remote_ip, local_ip = unmapped(remote[0]), unmapped(local[0])
        for name in ("TCP6REMOTEIP", "TCP6REMOTEPORT", "TCP6LOCALIP", "TCP6LOCALPORT"):
            env.pop(name, None)
        if ":" in remote_ip:                # a real IPv6 client: as tcpserver's IPv6 version
            env["PROTO"] = "TCP6"
            env["TCP6REMOTEIP"], env["TCP6REMOTEPORT"] = remote_ip, str(remote[1])
            env["TCP6LOCALIP"], env["TCP6LOCALPORT"] = local_ip, str(local[1])
        else:
            env["PROTO"] = "TCP"
        env["TCPREMOTEIP"] = remote_ip
        env["TCPREMOTEPORT"] = str(remote[1])
        env["TCPLOCALIP"] = local_ip
        env["TCPLOCALPORT"] = str(local[1])
        if self.local_host is not None:
            env["TCPLOCALHOST"] = self.local_host
        for name in ("TCPREMOTEHOST", "TCPREMOTEINFO"):
            env.pop(name, None)
        env.update(variables)
        os.dup2(conn.fileno(), 0)
        os.dup2(conn.fileno(), 1)
        conn.close()
        self._installed = replace_environ(os.environ, env, self._installed)
        return self.handler(env)


def _release_connection():
    """After a session: fds 0 and 1 on /dev/null, so the client sees the connection close."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, 0)
        os.dup2(null, 1)
    finally:
        os.close(null)

