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

Rules (tcprules' source format, see Rules) decide per client address whether a
connection is refused before any session runs or which variables its session
gets, as tcpserver -x does.

Not in tcpserver: at most `per_source` sessions run at once for one client
address (an IPv4 client of a dual-stack socket counted by its IPv4 address); a
connection beyond that is answered PER_SOURCE_REPLY and closed before it reaches a
worker, so one client cannot take every session slot.
"""
import os
import socket

from qmailpy.environ import replace as replace_environ
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


class Rules:
    """Per-client rules in tcprules' source format, read from a text file.

    A line is ADDRESS:allow or ADDRESS:deny, optionally followed by
    ,VAR="value" settings (any character may stand for the quotes); lines
    starting with # are comments. As tcpserver does, a client's rule is the one
    for its exact address, else for the longest prefix of it ending in a dot,
    else for the empty address; of several lines with the same address the
    first counts. A range like 10.1-3. stands for 10.1., 10.2. and 10.3.
    Addresses with = or @ (host names, ident) never match: the listener looks
    neither up. No rule for a client: allowed, nothing set.

    The file is reread when its inode, size or mtime changes, so checking it
    costs one stat per connection. An absent file means no rules.
    """

    def __init__(self, path):
        self.path = path
        self.signature = None
        self.table = {}

    def refresh(self):
        """Reread the file if it changed; an error text (old rules kept) or None."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            signature = None
        except OSError as e:
            return self._failed(("stat", e.errno), "unable to stat %s: %s" % (self.path, e.strerror))
        else:
            signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self.signature:
            return None
        if signature is None:
            self.signature, self.table = None, {}
            return None
        # as control/ files are read (qmailpy.home): qmail-smtpd-listen reads it as root, and
        # a single-user home's user could link it to /etc/shadow, whose first line the parse
        # error below would then quote in the user's log
        from qmailpy.home import ControlError, control_bytes
        try:
            data = control_bytes(self.path, self.path)
            table = parse_rules((data or b"").decode("utf-8", "surrogateescape"))
        except ControlError as e:
            return self._failed(signature, str(e))
        except ValueError as e:
            return self._failed(signature, "unable to parse %s: %s" % (self.path, e))
        self.signature, self.table = signature, table
        return None

    def _failed(self, signature, text):
        # Report a broken file once, not on every connection, until it changes again.
        if signature == self.signature:
            return None
        self.signature = signature
        return text

    def lookup(self, ip):
        """(allow, ((name, value), ...)) for a client address."""
        table = self.table
        rule = table.get(ip)
        end = len(ip)
        while rule is None:
            end = ip.rfind(".", 0, end)
            if end < 0:
                return table.get("", (True, ()))
            rule = table.get(ip[:end + 1])
        return rule


def parse_rules(text):
    """{address: (allow, variables)} from rules text; ValueError names a bad line."""
    table = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip(" \t\r")
        if not line or line[0] == "#":
            continue
        try:
            address, rule = _parse_rule(line)
            if "=" in address or "@" in address:
                continue
            keys = _expand_range(address)
        except ValueError:
            raise ValueError("line %d: %s" % (number, line)) from None
        for key in keys:
            table.setdefault(key, rule)
    return table


def _parse_rule(line):
    if "\0" in line:
        raise ValueError(line)
    # The address may itself hold colons (IPv6): the separator is the colon before the verb.
    colon = line.find(":")
    while colon >= 0 and not line.startswith(("allow", "deny"), colon + 1):
        colon = line.find(":", colon + 1)
    if colon < 0:
        raise ValueError(line)
    allow = line.startswith("allow", colon + 1)
    rest = line[colon + (6 if allow else 5):]
    variables = []
    while rest:
        equals = rest.find("=")
        if rest[0] != "," or equals < 2 or equals + 1 == len(rest):
            raise ValueError(line)
        close = rest.find(rest[equals + 1], equals + 2)
        if close < 0:
            raise ValueError(line)
        variables.append((rest[1:equals], rest[equals + 2:close]))
        rest = rest[close + 1:]
    return line[:colon], (allow, tuple(variables))


def _expand_range(address):
    """tcprules' ranges: 1.2.3.37-43 and 10.1-3. name each number in between."""
    dash = address.find("-")
    if dash < 0:
        return [address]
    left = address.rfind(".", 0, dash) + 1
    right = address.find(".", dash)
    if right < 0:
        right = len(address)
    low, high = address[left:dash], address[dash + 1:right]
    if not (low.isdigit() and high.isdigit() and low.isascii() and high.isascii()):
        raise ValueError(address)
    head, tail = address[:left], address[right:]
    return [head + str(n) + tail for n in range(int(low), min(int(high), 255) + 1)]
