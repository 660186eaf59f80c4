"""qmail-send's log lines (docs/qmail-send.md "Log (fd 0, unbuffered, one line per event)"): the one writer and the one parser.

Writers return the complete line as bytes, LF-terminated, exactly as qmail
words it. parse() turns one line (with or without a timestamp prefix added by a
supervisor) back into an Event. The audit and every test use parse(); qmail-send
uses the writers.
"""
import calendar
import re

from qmailpy.envelope import safe

RESULTS = ("success", "deferral", "failure")

# --- writers --------------------------------------------------------------


def status(local_used, local_limit, remote_used, remote_limit, exitasap=False):
    return b"status: local %d/%d remote %d/%d%s\n" % (
        local_used, local_limit, remote_used, remote_limit, b" exitasap" if exitasap else b"")


def status_exiting():
    return b"status: exiting\n"


def new_msg(n):
    return b"new msg %d\n" % n


def info_msg(n, size, sender, qp, uid):
    return b"info msg %d: bytes %d from <%s> qp %d uid %d\n" % (n, size, safe(sender), qp, uid)


def starting_delivery(d, n, channel, recipient):
    return b"starting delivery %d: msg %d to %s %s\n" % (d, n, channel.encode(), safe(recipient))


def delivery(d, result, text):
    """result is 'success', 'deferral' or 'failure'."""
    return b"delivery %d: %s: %s\n" % (d, result.encode(), safe(text))


def report_mangled(d):
    return b"delivery %d: report mangled, will defer\n" % d


def bounce_msg(n, qp):
    return b"bounce msg %d qp %d\n" % (n, qp)


def triple_bounce(n):
    return b"triple bounce: discarding bounce/%d\n" % n


def end_msg(n):
    return b"end msg %d\n" % n


# qmailctl queue ACTION carried out on one message (qmailpy/command.py); "bounce"
# is written by bounce_now(), which gives the reason.
COMMAND_ACTIONS = ("delete", "hold", "release", "requeue")


def command_msg(action, n):
    """delete msg N (the message is gone: no end msg follows), hold, release, requeue."""
    if action not in COMMAND_ACTIONS:
        raise ValueError("unknown command action %r" % action)
    return b"%s msg %d\n" % (action.encode(), n)


def bounce_now(n, reason):
    """The pending recipients of message n failed now (qmailctl queue bounce); its
    bounce msg and end msg follow."""
    return b"bounce now msg %d: %s\n" % (n, safe(_b(reason)))


def alert(text):
    return b"alert: " + _b(text) + b"\n"


def warning(text):
    return b"warning: " + _b(text) + b"\n"


def state_restored(n, seg, off, damage_seg, damage_off):
    """The log backend brought message n back from its last readable record (log/damage.py)."""
    return (b"warning: msg %d: state restored from log segment %d offset %d"
            b" after damage at segment %d offset %d\n" % (n, seg, off, damage_seg, damage_off))


def ended_without_body(n, mess_rel):
    """The log backend ended message n, whose live snapshot had lost its FINISH and whose
    body is gone, instead of delivering it again for ever (log/recovery.py)."""
    return b"warning: msg %d: ended: %s is gone and the log holds no FINISH\n" % (n, _b(mess_rel))


def set_aside(n, reason):
    """qmail-send cannot process message n (the reason says why) and leaves it where it is,
    untouched, for the administrator (docs/qmail-send.md "Messages set aside"); logged
    whenever it meets the message, at each start."""
    return b"warning: msg %d: set aside: %s\n" % (n, _b(reason).replace(b"\n", b"/"))  # our own text


def throttling(domain, control, limit):
    """Deliveries to a recipient domain start waiting for a limit of control/CONTROL
    (send/throttle.py); logged again only after the domain was idle (nothing in flight or held)."""
    return b"throttling %s: control/%s limit %s reached\n" % (safe(_b(domain)), _b(control), _b(limit))


def qmqp_from(address, qp):
    """qmail-qmqpd's line (its own log, not qmail-send's) for a message a TCP client handed
    it: the client's address and the qp its answer named, which qmail-send's `info msg`
    of the message carries. The audit links a null client's hand-off by it (spark/fleet.py)."""
    return b"qmail-qmqpd: qmqp from %s qp %d\n" % (_b(address), qp)


_QMQP_FROM = re.compile(r"qmail-qmqpd: qmqp from (?P<address>\S+) qp (?P<qp>\d+)$")


def parse_qmqp_from(line):
    """(time or None, client address, qp) of a qmqp_from() line with any prefix parse() reads,
    or None for any other line."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "surrogateescape")
    for when, _host, text in _prefix_readings(line.rstrip("\n")):
        m = _QMQP_FROM.match(text)
        if m:
            return when, m.group("address"), int(m.group("qp"))
    return None


def _b(text):
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text


# --- parser ---------------------------------------------------------------


class Event:
    """One parsed line. kind is one of KINDS; fields depend on it (see _PATTERNS)."""
    __slots__ = ("time", "host", "kind", "fields", "text")

    def __init__(self, time, host, kind, fields, text):
        self.time = time          # epoch seconds (float) or None
        self.host = host          # from a journald prefix, else None
        self.kind = kind
        self.fields = fields      # dict of str -> int | str
        self.text = text          # the line without its timestamp prefix

    def __repr__(self):
        return "Event(%r, %r, %r)" % (self.time, self.kind, self.fields)


_PATTERNS = [
    ("status", re.compile(
        r"status: local (?P<local_used>\d+)/(?P<local_limit>\d+) "
        r"remote (?P<remote_used>\d+)/(?P<remote_limit>\d+)(?P<exitasap> exitasap)?$")),
    ("exiting", re.compile(r"status: exiting$")),
    ("new msg", re.compile(r"new msg (?P<n>\d+)$")),
    ("info msg", re.compile(
        r"info msg (?P<n>\d+): bytes (?P<bytes>\d+) from <(?P<sender>[^ ]*)> "
        r"qp (?P<qp>\d+) uid (?P<uid>\d+)$")),
    ("starting delivery", re.compile(
        r"starting delivery (?P<d>\d+): msg (?P<n>\d+) to (?P<channel>local|remote) "
        r"(?P<recipient>\S*)$")),
    ("delivery", re.compile(
        r"delivery (?P<d>\d+): (?P<result>success|deferral|failure): (?P<text>\S*)$")),
    ("report mangled", re.compile(r"delivery (?P<d>\d+): report mangled, will defer$")),
    ("bounce msg", re.compile(r"bounce msg (?P<n>\d+) qp (?P<qp>\d+)$")),
    ("triple bounce", re.compile(r"triple bounce: discarding bounce/(?P<n>\d+)$")),
    ("end msg", re.compile(r"end msg (?P<n>\d+)$")),
    ("delete msg", re.compile(r"delete msg (?P<n>\d+)$")),
    ("hold msg", re.compile(r"hold msg (?P<n>\d+)$")),
    ("release msg", re.compile(r"release msg (?P<n>\d+)$")),
    ("requeue msg", re.compile(r"requeue msg (?P<n>\d+)$")),
    ("bounce now", re.compile(r"bounce now msg (?P<n>\d+): (?P<text>.*)$")),
    ("alert", re.compile(r"alert: (?P<text>.*)$")),
    ("state restored", re.compile(
        r"warning: msg (?P<n>\d+): state restored from log segment (?P<seg>\d+) offset (?P<off>\d+) "
        r"after damage at segment (?P<damage_seg>\d+) offset (?P<damage_off>\d+)$")),
    ("set aside", re.compile(r"warning: msg (?P<n>\d+): set aside: (?P<text>.*)$")),
    ("throttling", re.compile(
        r"throttling (?P<domain>\S+): control/(?P<control>\w+) limit (?P<limit>\S+) reached$")),
    ("warning", re.compile(r"warning: (?P<text>.*)$")),
]
KINDS = tuple(kind for kind, _ in _PATTERNS) + ("unknown",)
_INT_FIELDS = {"local_used", "local_limit", "remote_used", "remote_limit",
               "n", "bytes", "qp", "uid", "d", "seg", "off", "damage_seg", "damage_off"}

_EPOCH = re.compile(r"(\d{9,11}(?:\.\d{1,9})?) ")
_TAI64N = re.compile(r"@([0-9a-f]{16})([0-9a-f]{8}) ")
_ISO = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?"
    r"(Z|[+-]\d\d:?\d\d)? ")
_JOURNAL_TAG = re.compile(r"(\S+) [^\s:\[]+(?:\[\d+\])?: ")


def parse_prefix(line):
    """(epoch seconds or None, host or None, rest) for a line with any supported prefix.

    Supported: epoch 'SEC.USEC ', multilog TAI64N '@4000…', ISO-8601 (qmailctl
    start's prefix), and journalctl -o short-iso / short-iso-precise, whose
    'HOST IDENT[PID]: ' after the time gives the host.
    """
    return _reading(_prefix_readings(line))[:3]


def _prefix_readings(line):
    """Every reading of the prefix, most likely first.

    An ISO stamp followed by 'WORD WORD: ' is read as journald's 'HOST IDENT: '
    first and as a bare qmail line second: qmail's own 'delivery 5: ...' and
    'triple bounce: ...' look like a journald tag after qmailctl start's stamp.
    """
    m = _EPOCH.match(line)
    if m:
        return [(float(m.group(1)), None, line[m.end():])]
    m = _TAI64N.match(line)
    if m:
        sec = int(m.group(1), 16) - 2 ** 62 - 10
        return [(sec + int(m.group(2), 16) / 1e9, None, line[m.end():])]
    m = _ISO.match(line)
    if m:
        year, mon, day, hh, mm, ss = (int(g) for g in m.groups()[:6])
        when = calendar.timegm((year, mon, day, hh, mm, ss, 0, 0, 0))
        if m.group(7):
            when += float(m.group(7))
        zone = m.group(8)
        if zone and zone != "Z":
            sign = -1 if zone[0] == "+" else 1
            digits = zone[1:].replace(":", "")
            when += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        rest = line[m.end():]
        j = _JOURNAL_TAG.match(rest)
        if j:
            return [(when, j.group(1), rest[j.end():]), (when, None, rest)]
        return [(when, None, rest)]
    return [(None, None, line)]


def _reading(readings):
    """(when, host, text, kind, match) of the first reading whose text is a qmail line,
    else the most likely reading with kind None."""
    for when, host, text in readings:
        for kind, pattern in _PATTERNS:
            m = pattern.match(text)
            if m:
                return when, host, text, kind, m
    when, host, text = readings[0]
    return when, host, text, None, None


def parse(line):
    """An Event for one log line (str or bytes); unknown lines give kind 'unknown'."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "surrogateescape")
    line = line.rstrip("\n")
    when, host, text, kind, m = _reading(_prefix_readings(line))
    if kind is not None:
        fields = {}
        for key, value in m.groupdict().items():
            if key in _INT_FIELDS:
                fields[key] = int(value)
            elif key == "exitasap":
                fields[key] = value is not None
            else:
                fields[key] = value
        return Event(when, host, kind, fields, text)
    return Event(when, host, "unknown", {}, text)
