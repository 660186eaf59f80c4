"""One qmail-remote run: route, look up, connect, talk, report (docs/delivery.md "qmail-remote").

run(args, home) takes qmail-remote's arguments (host, sender, recipients, as
bytes) with the message on fd 0, and writes its records to fd 1: each is a
letter and a text followed by NUL. It always returns 0, as qmail-remote always
exits 0; qmail-rspawn turns the records into one K/Z/D result.
"""
import os

from qmailpy.envelope import quote

PROGRAM = "qmail-remote"

TEMP_NOMEM = b"ZOut of memory. (#4.3.0)\n"
TEMP_OSERR = b"ZSystem resources temporarily unavailable. (#4.3.0)\n"
TEMP_NOCONN = b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n"
TEMP_DNS = b"ZSorry, I couldn't find any host by that name. (#4.1.2)\n"
TEMP_CHDIR = b"ZUnable to switch to home directory. (#4.3.0)\n"
TEMP_CONTROL = b"ZUnable to read control files. (#4.3.0)\n"
PERM_USAGE = b"DI (qmail-remote) was invoked improperly. (#5.3.5)\n"
PERM_NOMX = b"DSorry, I couldn't find a mail exchanger or IP address. (#5.4.4)\n"
PERM_AMBIGMX = (b"DSorry. Although I'm listed as a best-preference MX or A for that host,\n"
                b"it isn't in my control/locals file, so I don't treat it as local. (#5.4.6)\n")
# Not in qmail: an address with CR or LF would put a bare line ending on the wire.
PERM_BADADDR = b"DSorry, an address with a CR or LF cannot be sent by SMTP. (#5.1.3)\n"


def perm_dns(host):
    shown = bytes(ch if 33 <= ch <= 126 else 0x3F for ch in host)
    return b"DSorry, I couldn't find any host named " + shown + b". (#5.1.2)\n"


def smtp_address(addr):
    """quote(local)@domain; an address without '@' goes out as it is ('' -> '<>').

    Bytes above 127 do not make a local part need quotes: RFC 6531 lets UTF-8
    stand in an atom, and such an address goes out only with SMTPUTF8."""
    at = addr.rfind(b"@")
    if at < 0:
        return addr
    masked = addr[:at].translate(_HIGH_AS_A)
    if quote(masked) == masked:
        return addr
    return quote(addr[:at]) + addr[at:]


_HIGH_AS_A = bytes(range(128)) + b"a" * 128


class Controls:
    __slots__ = ("timeout", "timeoutconnect", "session", "helohost", "routes", "sources",
                 "tlsdestinations", "dns", "dkimkeys")


def outgoing_sources(lines):
    """{4: IPv4 text, 16: IPv6 text} from control/outgoingip (one address of each
    family at most); raises ControlError on anything else."""
    from qmailpy.home import ControlError
    from qmailpy.remote.dns import format_ip, ip_literal
    sources = {}
    for line in lines:
        text = line.strip()
        ip = ip_literal(b"[" + text + b"]")
        if ip is None or len(ip) in sources:
            raise ControlError("control/outgoingip: %r is not one IPv4 and one IPv6 address" % text)
        sources[len(ip)] = format_ip(ip).decode("ascii")
    return sources


def read_controls(home):
    """qmail-remote's controls; raises ControlError (also when helohost and me are absent)."""
    from qmailpy import dkimkeys, resolver
    from qmailpy.home import ControlError, control_int, control_list, control_value
    from qmailpy.remote import tls
    from qmailpy.remote.routes import route_table
    from qmailpy.remote.tls import policy_table
    c = Controls()
    c.timeout = control_int(home, "timeoutremote", 1200)
    c.timeoutconnect = control_int(home, "timeoutconnect", 60)
    c.session = max(0, control_int(home, "timeoutremotesession", 3600))     # 0: no deadline
    helo = control_value(home, "helohost")
    if helo is None:
        helo = control_value(home, "me")
    if helo is None:
        raise ControlError("neither control/helohost nor control/me")
    if b"\r" in helo:
        raise ControlError("control/helohost has a CR")
    c.helohost = helo
    c.routes = route_table(control_list(home, "smtproutes", []))
    c.sources = outgoing_sources(control_list(home, "outgoingip", []))
    c.tlsdestinations = policy_table(control_list(home, tls.CONTROL, []))
    c.dns = resolver.settings(home)
    c.dkimkeys = dkimkeys.entries(control_list(home, dkimkeys.CONTROL, []))
    return c


class _Done(Exception):
    """Raised by a step of deliver() with the run's records: the run ends here."""


def deliver(args, home, messfd=0, lookup=None, now=None, pid=None, cache=None, alone=None,
            bugs=None):
    """The records of one run (a list of bytes, each without its NUL).

    cache: a remote.cache.Connections of qmail-rspawn's delivery worker: a connection
    it holds to an eligible address is used first (RSET, then the transaction), and
    one whose peer accepted the message is kept in it instead of closed.
    alone: a list that gets, once a peer answered the recipients, the verdict a
    recipient it refused would have had in a run of its own (smtp.giving_up).
    bugs: as for records_of, for a bug in keeping a connection (the verdict stands)."""
    if len(args) < 3:
        return [PERM_USAGE]
    try:
        run = _Run(args, _controls(home), pid, now)
        run.bugs = bugs
        eligible = run.eligible(lookup)
        run.message = _message(run.controls, messfd)
        return run.send(eligible, messfd, cache, alone)
    except _Done as done:
        return done.args[0]


def _controls(home):
    from qmailpy.home import ControlError
    try:
        os.chdir(home)
    except OSError:
        raise _Done([TEMP_CHDIR]) from None
    try:
        return read_controls(home)
    except ControlError:
        raise _Done([TEMP_CONTROL]) from None


class _Run:
    """What one run knows once its controls are read: where to, from whom, to whom."""

    def __init__(self, args, controls, pid, now):
        from qmailpy.remote import routes
        self.domain, self.controls = args[0], controls
        self.host, self.port = args[0], routes.SMTP_PORT
        self.relay = routes.find_relay(controls.routes, self.host)
        if self.relay is not None:
            self.host, self.port = routes.split_relay(self.relay)
        if any(b"\r" in a or b"\n" in a for a in args[1:]):
            raise _Done([PERM_BADADDR])
        self.sender = smtp_address(args[1])
        self.recipients = [smtp_address(r) for r in args[2:]]
        self.pid = os.getpid() if pid is None else pid
        if now is None:
            import time
            now = lambda: int(time.time())        # noqa: E731
        self.now = now
        self.message = None     # smtputf8.Message, read once the addresses are known
        self.tls = None         # (required, cafile) of control/tlsdestinations
        self.failure = TEMP_NOCONN  # the report when no address does better
        self.clear = None       # the TLS line of a delivery in clear after STARTTLS failed
        self.bugs = None        # records_of's list for tracebacks

    def eligible(self, lookup):
        """The (pref, ip, name) rows to try, best first."""
        from qmailpy.remote import dns
        host = self.host
        if lookup is None and (not host or dns.ip_literal(host) is None):
            lookup = dns.resolver_lookup(config=self.controls.dns)
        try:
            if self.relay is not None:
                found, soft = dns.addresses(host, lookup), False
            else:
                found, soft = dns.mx_addresses(host, self.now() + (self.pid << 16), lookup)
        except dns.DNSSoft:
            raise _Done([TEMP_DNS]) from None
        except dns.DNSHard:
            raise _Done([perm_dns(host)]) from None
        if soft and not found:
            raise _Done([TEMP_DNS])
        if not found:
            raise _Done([PERM_NOMX])
        if self.relay is not None:
            return found
        try:
            mine = dns.local_addresses()
        except OSError:
            raise _Done([TEMP_OSERR]) from None
        prefme = min((pref for pref, ip, _ in found if ip in mine), default=100000)
        eligible = [row for row in found if row[0] < prefme]
        if not eligible:
            raise _Done([PERM_AMBIGMX])
        return eligible

    def send(self, eligible, messfd, cache, alone):
        """Try the eligible addresses in turn; the records of the first that answered."""
        from qmailpy.remote import tls
        from qmailpy.remote.tcpto import Table
        self.tls = tls.find_policy(self.controls.tlsdestinations, self.domain)
        table = Table(now=self.now, pid=self.pid)
        required, cafile = self.tls
        for _, ip, name in eligible:
            if table.suppressed(ip):
                continue
            policy = tls.Policy(required, cafile,
                                [n for n in (name, self.domain) if cert_name(n)])
            # Opportunistic TLS that fails (STARTTLS refused, a handshake that breaks) is
            # retried on a new connection in clear, as Postfix's "may" level does: a peer
            # with a broken TLS stack must not see its mail bounce after queuelifetime.
            for use_tls in (True,) if required else (True, False):
                records, reached = self.attempt(ip, policy, use_tls, messfd, cache, table, alone)
                if records is not None:
                    return records
                if not reached:
                    break
        return [self.failure]

    def attempt(self, ip, policy, use_tls, messfd, cache, table, alone):
        """(records of a transaction with ip or None, False when ip could not be reached)."""
        from qmailpy.remote import dns
        partner = dns.format_ip(ip)
        key = (partner, self.port, use_tls) + self.tls + (tuple(policy.names),)
        keep = None if cache is None else _guarded(cache.keeper(key), self.bugs)
        held = None if cache is None else cache.take(key)
        if held is not None:
            conn, extensions = held
            records = self.talk(conn, partner, messfd, policy, use_tls, keep, alone, extensions)
            if records is not None:
                return records, True
        conn = self.connect(ip, partner, use_tls, table)
        if conn is None:
            return None, False
        return self.talk(conn, partner, messfd, policy, use_tls, keep, alone), True

    def connect(self, ip, partner, use_tls, table):
        """A new Connection to ip, or None when it could not be reached."""
        import time
        from qmailpy.remote import smtp
        controls = self.controls
        sock, timed_out = smtp.connect(partner.decode("ascii"), self.port,
                                       controls.timeoutconnect, controls.sources.get(len(ip)))
        if sock is None:
            table.record(ip, timed_out)
            return None
        table.record(ip, False)
        deadline = time.monotonic() + controls.session if controls.session else None
        conn = smtp.Connection(sock, controls.timeout, deadline)
        if not use_tls:
            conn.tls = self.clear
        return conn

    def talk(self, conn, partner, messfd, policy, use_tls, keep, alone, reused=None):
        """The transaction on conn (reused: a kept connection's EHLO extensions); None when
        a kept connection was stale, or STARTTLS failed on a new one (then self.clear says
        why, for the retry in clear)."""
        import time
        from qmailpy.remote import smtp
        controls = self.controls
        if reused is not None:
            conn.deadline = time.monotonic() + controls.session if controls.session else None
        records = []
        try:
            verdict = smtp.dialogue(conn, partner, controls.helohost, self.sender,
                                    self.recipients, messfd, records, policy, use_tls,
                                    self.message, reused=reused, keep=keep)
        except smtp.Stale:
            if reused is None:
                raise
            return None                     # gone while kept: a new connection next
        except smtp.TryNext as e:
            if reused is not None:
                raise
            self.failure, why = e.args
            # the report says why a peer that offers STARTTLS got the message in clear
            self.clear = b"TLS: none, " + why.replace(b"\n", b" ") + b"."
            return None
        records.append(verdict)
        if alone is not None:
            alone.append(smtp.giving_up(partner, conn))
        return records


def _guarded(keep, bugs):
    """keep for smtp.dialogue, which calls it once the peer has accepted the message: a bug
    in it is reported (_bug) and the connection closed, but the run's verdict stands, or the
    message would be deferred and sent again."""
    def guarded(conn, extensions):
        try:
            keep(conn, extensions)
        except Exception as e:
            conn.close()
            _bug(e, bugs)
    return guarded


def _bug(exc, bugs):
    """exc's traceback appended to bugs (a list), or else written on fd 2."""
    from qmailpy import internalerror
    trace = internalerror.trace(PROGRAM, exc)
    if bugs is None:
        internalerror.write(2, trace)
    else:
        bugs.append(trace)


def _message(controls, messfd):
    """The message as smtputf8.read_message reads it, with its DKIM signature prefix."""
    from qmailpy.remote import smtp, smtputf8
    try:
        message = smtputf8.read_message(messfd)
    except OSError:
        raise _Done([smtp.READ_FAILED]) from None
    if controls.dkimkeys:
        from qmailpy.remote import dkimsign
        try:
            message.prefix = dkimsign.prefix(controls.dkimkeys, messfd, message)
        except OSError:
            raise _Done([smtp.READ_FAILED]) from None
        except dkimsign.Refused as e:
            raise _Done([e.args[0]]) from None
    return message


def cert_name(host):
    """True if host is a name a certificate may carry (not empty, not an IP literal, ASCII)."""
    from qmailpy.remote.dns import ip_literal
    return bool(host) and host.isascii() and ip_literal(host) is None


def output(records):
    """The bytes qmail-remote writes on fd 1."""
    return b"".join(r + b"\0" for r in records)


def records_of(args, home, messfd=0, cache=None, alone=None, bugs=None):
    """deliver()'s records. An exception it does not foresee is a bug: a deferral that
    says "internal error" and names it (the mail stays queued until the bug is fixed), its
    traceback appended to bugs (a list) or else written on fd 2 (docs/delivery.md
    "Internal errors")."""
    from qmailpy import internalerror
    try:
        return deliver(args, home, messfd, cache=cache, alone=alone, bugs=bugs)
    except MemoryError:
        return [TEMP_NOMEM]
    except Exception as e:
        _bug(e, bugs)
        return [b"Z" + internalerror.summary(PROGRAM, e) + b" (#4.3.0)\n"]


def run(args, home, messfd=0, outfd=1):
    """qmail-remote: deliver and write the records on outfd; always returns 0."""
    bugs = []
    data = output(records_of(args, home, messfd, bugs=bugs))
    try:
        while data:
            data = data[os.write(outfd, data):]
    except OSError:
        pass
    if bugs:        # after the records: under qmail-rspawn fd 2 is the same pipe as fd 1
        from qmailpy import internalerror
        internalerror.write(2, bugs[0])
    return 0
