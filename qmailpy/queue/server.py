"""qmail-qmqpd's work: answer QMQP requests by queueing them (qmail-qmqpd(8)).

One long-lived process, running as the queue's owner, listens on the local
socket (every local user may connect) and optionally on TCP, and hands each
connection to a queueing worker (qmailpy.workerserver): a process forked from
the server once, with no exec (qmail-queue's code is already loaded, see
qmailqueue.prepare), that serves one request at a time and many in its life.
For each request the worker reads against a deadline and runs qmail-queue's
code (qmailqueue.run_from) while it reads, with the message streamed into
mess/ (qmailpy.mess) and the envelope into intd/ (or the log), for the uid the
kernel reports for a local client (SO_PEERCRED) or qmaild's uid for a TCP
client ("from network"). Workers queueing at the same time share their fsyncs
where the backend allows it (the log backend's group commit). Its answer is qmail-qmqpd's: "Kok TIME qp PID",
or qmail-queue's text for its exit code. A request that breaks the protocol,
ends early or outlasts the deadline leaves nothing in the queue: every file
made for it is removed before the answer (or the close).

TCP clients are checked against control/qmqpclients (tcprules' source format,
qmailpy.clientrules.Rules) before a worker sees them; a denied one is closed unanswered.

Size limits are qmail's: control/databytes bounds what arrives from the network (TCP
here; qmail-smtpd checks its own), never what qmail itself queues (bounces and double
bounces from qmails, forwards), and a local user only when the administrator sets
control/localdatabytes (docs/submission.md "Size limits").
"""
import os
import socket
import struct
import time

from qmailpy.workerserver import DEFAULT_MAX_IDLE, DEFAULT_MAX_USE, REFUSED, WorkerServer, default_reserved
from qmailpy.mess import MAX_HOLD
from qmailpy.queue.client import ADDRESS_REFUSED, explain
from qmailpy.queue.qmqp import MAX_OPTION, MAX_OPTIONS, NOT_QMQP, netstring, parse_option
from qmailpy.sizelimits import LOCAL_CONTROL, NETWORK_CONTROL

DEFAULT_LIMIT = 40            # requests served at once; more connections wait in the backlog
DEFAULT_TIMEOUT = 1200        # seconds a connection may take, from accept to answer
_CHUNK = 65536
_MAX_DIGITS = 20

R_TRUNCATED = b"Zthe QMQP request ended early (#4.3.0)"
R_TIMEOUT = b"Ztimeout reading the QMQP request (#4.4.2)"
R_SLOW = b"Zthe QMQP request arrived too slowly (#4.4.2)"
# An ordinary local client's request must arrive whole at this pace: within LOCAL_PACE[0]
# seconds of a worker taking it, plus a second for each LOCAL_PACE[1] bytes. qmail's own
# clients (sendmail, qmail-inject, qmail-queue's client) spool first and send at disk
# speed; a silent or trickling connection gives its worker back within seconds instead
# of the 1200 s of DEFAULT_TIMEOUT, so two users cannot keep a third waiting (issue 23).
# qmaild and qmails (Server's `unlimited`) and TCP clients keep DEFAULT_TIMEOUT.
LOCAL_PACE = (5.0, 256 * 1024)
R_SYNTAX = NOT_QMQP
R_SIZE = b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"
R_ADDRESS = ADDRESS_REFUSED
R_CONTROLS = b"Zunable to read controls (#4.3.0)"
R_HOLD = b"Dsorry, that hold is longer than I allow (#5.5.4)"


class BadRequest(OSError):
    """The request cannot be queued; .answer is what the client is told.

    An OSError, so that qmail-queue's code, reading through Request, treats it
    as a read error: it removes what it made and returns 54."""

    def __init__(self, answer):
        super().__init__(answer.decode("ascii", "replace"))
        self.answer = answer


class Request:
    """One QMQP request read from a connected socket before a deadline (time.monotonic())."""

    def __init__(self, conn, deadline, pace=None):
        self.conn = conn
        self.deadline = deadline
        self.pace = pace          # (grace, bytes per second): see LOCAL_PACE
        self.started = time.monotonic()
        self.received = 0
        self.buf = b""
        self.left = 0             # bytes of the outer netstring not yet read
        self.message_left = 0
        self.envelope_started = self.finished = False
        self.records = 0          # envelope records handed out so far
        self.failure = None
        self.not_before = None    # epoch seconds, from the local socket's option
        self.hold = False         # the local socket's "hold" option: queued on hold

    def fail(self, answer):
        if self.failure is None:
            self.failure = answer
        raise BadRequest(self.failure)

    def _recv(self):
        deadline, answer = self.deadline, R_TIMEOUT
        if self.pace is not None:
            grace, rate = self.pace
            due = self.started + grace + self.received / rate
            if due < deadline:
                deadline, answer = due, R_SLOW
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.fail(answer)
        self.conn.settimeout(remaining)
        try:
            data = self.conn.recv(_CHUNK)
        except socket.timeout:
            self.fail(answer)
        except OSError:
            self.fail(R_TRUNCATED)
        if not data:
            self.fail(R_TRUNCATED)
        self.received += len(data)
        return data

    def _take(self, n):
        while len(self.buf) < n:
            self.buf += self._recv()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _count(self, n):
        self.left -= n
        if self.left < 0:
            self.fail(R_SYNTAX)

    def _length(self, counted=True):
        colon = self.buf.find(b":", 0, _MAX_DIGITS + 1)
        if colon > 0 and self.buf[:colon].isdigit():         # the usual case: all buffered
            if counted:
                self._count(colon + 1)
            length, self.buf = int(self.buf[:colon]), self.buf[colon + 1:]
            return length
        digits = b""
        while True:
            ch = self._take(1)
            if counted:
                self._count(1)
            if ch == b":" and digits:
                return int(digits)
            if not (b"0" <= ch <= b"9") or len(digits) >= _MAX_DIGITS:
                self.fail(R_SYNTAX)
            digits += ch

    def _comma(self, counted=True):
        if self._take(1) != b",":
            self.fail(R_SYNTAX)
        if counted:
            self._count(1)

    def _peek(self):
        if not self.buf:
            self.buf = self._recv()
        return self.buf[:1]

    def read_head(self, databytes, options=False, may_hold=False):
        """The outer length and the message's; R_SIZE (after reading the rest) if the
        message is longer than databytes (0: no limit). options: "notbefore=" and "hold"
        netstrings may come first, each once (qmailpy.queue.qmqp; local socket only).
        may_hold: the caller may queue on hold (Server.may_hold); else "hold" is R_HOLD."""
        self.left = self._length(counted=False)
        seen = set()
        while options and not self._peek().isdigit():
            if self.left > MAX_OPTION or len(seen) >= MAX_OPTIONS:
                self.fail(R_SYNTAX)
            try:
                name, value = parse_option(self._take(self.left))
            except ValueError:
                self.fail(R_SYNTAX)
            if name in seen:
                self.fail(R_SYNTAX)
            seen.add(name)
            self._comma(counted=False)
            if name == "hold":
                if not may_hold:        # until a release: longer than any MAX_HOLD
                    self.fail(R_HOLD)
                self.hold = True
            else:
                now = time.time()
                if value - now > MAX_HOLD:
                    self.fail(R_HOLD)
                # a time already come is no hold: the mess file keeps its real mtime
                # (metrics' oldest message reads it)
                self.not_before = value if value > now else None
            self.left = self._length(counted=False)
        self.message_left = self._length()
        self._count(self.message_left + 1)          # the message and its comma fit inside
        if databytes and self.message_left > databytes:
            try:
                self._discard(self.message_left + 1 + self.left + 1)
            except BadRequest:
                pass
            self.failure = R_SIZE
            raise BadRequest(R_SIZE)

    def _discard(self, n):
        n -= len(self.buf)
        self.buf = b""
        while n > 0:
            n -= len(self._recv())

    def read_message(self):
        """The message, chunk by chunk; b"" after its last byte (and its comma)."""
        if self.message_left:
            if not self.buf:
                self.buf = self._recv()
            data, self.buf = self.buf[:self.message_left], self.buf[self.message_left:]
            self.message_left -= len(data)
            return data
        if not self.envelope_started:
            self.envelope_started = True
            self._comma(counted=False)             # counted with the message
        return b""

    def read_envelope(self):
        """qmail-queue's envelope, one record per call: F sender, T recipient..., NUL."""
        if self.finished:
            return b""
        if not self.envelope_started:             # the message was not read to its end
            self.fail(R_SYNTAX)
        first = self.records == 0
        if self.left == 0:
            if first:
                self.fail(R_SYNTAX)                 # no sender
            self._comma(counted=False)              # the outer netstring's
            self.finished = True
            return b"\0"
        length = self._length()
        from qmailpy.envelope import MAX_ADDRESS
        if length > MAX_ADDRESS:
            self.fail(explain(11))
        self._count(length + 1)
        address = self._take(length)
        self._comma(counted=False)
        if b"\0" in address:
            self.fail(R_ADDRESS)
        self.records += 1
        return (b"F" if first else b"T") + address + b"\0"


def peer_uid(conn):
    """The connecting process's uid, as the kernel recorded it at connect()."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def handle(home, conn, uid, timeout, syncs=None, local=False, size_limit=None, pace=None,
           may_hold=False):
    """Read, queue and answer one request in a worker; the exit status. local: from the
    local socket, whose requests may carry a not-before time and, when may_hold, a hold.
    size_limit: the control file holding the largest message size (absent or 0: no limit),
    or None for none. pace: (grace seconds, bytes per second) the request must arrive at
    (LOCAL_PACE)."""
    from qmailpy.home import ControlError
    from qmailpy.queue.qmailqueue import run_from
    from qmailpy.sizelimits import read_limit
    request = Request(conn, time.monotonic() + timeout, pace)
    code = None
    try:
        databytes = 0 if size_limit is None else read_limit(home, size_limit)
    except ControlError:
        request.failure = R_CONTROLS
    else:
        try:
            request.read_head(databytes, options=local, may_hold=may_hold)
        except BadRequest:
            pass
        else:
            code = run_from(home, request.read_message, request.read_envelope, uid, tidy=True,
                            not_before=request.not_before, resident=True, syncs=syncs,
                            hold=request.hold)
    if request.failure is not None:
        answer = request.failure
    elif code == 0:
        answer = b"Kok %d qp %d" % (int(time.time()), os.getpid())
        if not local:
            log_tcp_client(conn, os.getpid())
    else:
        answer = explain(code)
    try:
        conn.settimeout(max(1.0, request.deadline - time.monotonic()))
        conn.sendall(netstring(answer))
    except OSError:
        return 1
    return 0 if code == 0 else 1


def log_tcp_client(conn, qp):
    """qmail-qmqpd's log line naming the TCP client whose message was queued with this qp,
    written before the answer: whenever a client can have read K, the line is there. A null
    client keeps no log; this is what links its message to it (qmail-qmqpd(8) "LOG")."""
    from qmailpy.logline import qmqp_from
    from qmailpy.util.ipaddr import unmapped
    try:
        address = unmapped(conn.getpeername()[0])   # as the MAP names it on a dual-stack socket
    except OSError:
        address = "unknown"
    try:
        os.write(2, qmqp_from(address, qp))     # one write, under PIPE_BUF: never interleaved
    except OSError:
        pass


R_TOO_MANY = b"Ztoo many connections from your uid or address (#4.3.2)"
WAIT_PER_CLIENT = 256         # requests of one client waiting for its share of workers
WAIT_LIMIT = 1024             # requests waiting in all


class Server(WorkerServer):
    """qmail-qmqpd's accept loop (qmailpy.workerserver): requests handed to queueing workers.

    The uids in `unlimited` (qmaild, whose SMTP sessions all queue here, and qmails,
    whose bounces do) count against no client, and `reserved` workers (default a
    quarter, workerserver.default_reserved) are theirs alone: however many
    connections local users and TCP clients hold open, silent or slow, the SMTP
    hand-off and the bounces find a worker. Every other client (a local uid, a TCP
    address) may have at most per_client requests in workers at once (default: half
    of the others, rounded up), and all of them together limit - reserved. A request
    beyond that waits in line, holding no worker, until it may take one (a burst of
    submissions from one cron job still goes through), and one beyond WAIT_PER_CLIENT
    waiting, or WAIT_LIMIT waiting in all, gets R_TOO_MANY. An ordinary local client's
    request must arrive at LOCAL_PACE (else R_SLOW), so whoever holds workers with silent
    connections gives them back within seconds, and those waiting in line get them first."""

    def __init__(self, home, local=None, tcp=None, tcp_uid=None, rules=None,
                 limit=DEFAULT_LIMIT, timeout=DEFAULT_TIMEOUT, warn=None,
                 max_use=DEFAULT_MAX_USE, max_idle=DEFAULT_MAX_IDLE, per_client=None,
                 unlimited=(), reserved=None, local_pace=LOCAL_PACE):
        super().__init__([s for s in (local, tcp) if s is not None], limit, max_use, max_idle,
                         per_client, WAIT_PER_CLIENT, WAIT_LIMIT,
                         default_reserved(limit) if reserved is None else reserved)
        self.home = home
        self.local, self.tcp, self.tcp_uid = local, tcp, tcp_uid
        self.rules, self.warn = rules, warn
        self.timeout = timeout
        self.local_pace = local_pace
        self.unlimited = frozenset(unlimited)
        from qmailpy import privs
        try:        # qmail's own submitters: SMTP (checked there), bounces, alias's forwards
            self.any_size = frozenset(privs.role_uids(home, ("alias", "qmaild", "qmails")).values())
        except privs.PrivError:
            self.any_size = self.unlimited
        # who may queue on hold ("hold" option): a hold lasts until a release, so not an
        # ordinary user, whose not-before time may not pass MAX_HOLD; root and qmailq, who
        # may run qmail-queue with $QMAILHOLD anyway, and qmaild (a milter's quarantine)
        try:
            holders = privs.role_uids(home, ("qmaild", "qmailq")).values()
            self.may_hold = frozenset({0, *holders})
        except privs.PrivError:
            self.may_hold = frozenset({0})
        from qmailpy.groupsync import DirSyncs
        from qmailpy.queue.qmailqueue import SYNC_SLOTS
        try:
            self.syncs = DirSyncs(SYNC_SLOTS)   # opened here: every worker shares it
        except OSError:
            self.syncs = None                   # each worker then syncs alone

    def admit(self, sock, conn, remote):
        """(client, uid to queue for): qmaild's uid for an allowed TCP client, else the peer's."""
        if sock is self.tcp:
            if not self._allowed(remote[0]):
                return REFUSED
            return remote[0], self.tcp_uid
        try:
            uid = peer_uid(conn)
        except OSError:
            return REFUSED
        return uid, uid

    def client_of(self, context):
        return None if context[0] in self.unlimited else context[0]

    def too_many(self, conn, context):
        try:        # a fresh socket's buffer takes it; never wait for this client
            conn.send(netstring(R_TOO_MANY), socket.MSG_DONTWAIT)
        except OSError:
            pass

    def worker_started(self):
        from qmailpy.queue.qmailqueue import setup_resident
        setup_resident()

    def child(self, sock_index, conn, context):
        local = self.listening[sock_index] is not self.tcp
        if not local:
            size_limit = NETWORK_CONTROL
        else:
            size_limit = None if context[1] in self.any_size else LOCAL_CONTROL
        pace = self.local_pace if local and self.client_of(context) is not None else None
        may_hold = local and context[1] in self.may_hold
        return handle(self.home, conn, context[1], self.timeout, self.syncs, local, size_limit,
                      pace, may_hold)

    def _allowed(self, ip):
        if self.rules is None:
            return True
        error = self.rules.refresh()
        if error is not None and self.warn is not None:
            self.warn(error)
        return self.rules.lookup(ip)[0]


def inherited_sockets(environ):
    """Listening sockets passed by systemd (LISTEN_FDS from fd 3, for this LISTEN_PID);
    the variables are removed so that no child takes them for its own."""
    if environ.get("LISTEN_PID") != str(os.getpid()):
        return []
    try:
        count = int(environ.get("LISTEN_FDS", "0"))
    except ValueError:
        count = 0
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(name, None)
    socks = []
    for fd in range(3, 3 + count):
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)
        socks.append(sock)
    return socks


def bind_local(path, mode=0o666):
    """A listening Unix socket at path (a stale socket file there is replaced)."""
    import stat
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def bind_tcp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock
