"""The per-domain rules of qmail-send (docs/qmail-send.md "Throttling and delays").

control/concurrencydomains  domain:n                  at most n deliveries in flight
control/ratelimits          domain:messages/seconds   at most `messages` starts in any `seconds`
control/delaydomains        domain:seconds            no delivery before birth + seconds

A line's domain matches as in control/smtproutes: the recipient domain itself, then
".parent" lines for each parent domain, then an empty domain for every domain. A
limit counts per recipient domain, whichever line gave it. A bad line is reported
(Rules.warnings) and ignored; the other lines apply.
"""
from qmailpy.home import control_list

CONCURRENCY_MAX = 120           # control/concurrencyremote's own ceiling (send/controls.py)


def _positive(text):
    if not text.isdigit() or int(text) < 1:
        raise ValueError
    return int(text)


def _concurrency(text):
    return min(_positive(text), CONCURRENCY_MAX)


def _rate(text):
    messages, slash, seconds = text.partition("/")
    if not slash:
        raise ValueError
    return _positive(messages), _positive(seconds)


def _seconds(text):
    if not text.isdigit():
        raise ValueError
    return int(text)


# control file -> (what a value means, its parser); the order of Rules.lookup()'s result
FILES = (("concurrencydomains", "a count of 1 or more", _concurrency),
         ("ratelimits", "messages/seconds, both 1 or more", _rate),
         ("delaydomains", "seconds", _seconds))


class DomainTable:
    """domain (lower case, "" for every domain, ".parent" for subdomains) -> value."""

    def __init__(self):
        self.values = {}

    def __bool__(self):
        return bool(self.values)

    def lookup(self, domain):
        values = self.values
        if not values:
            return None
        if domain in values:
            return values[domain]
        i = domain.find(".")
        while i >= 0:
            value = values.get(domain[i:])
            if value is not None:
                return value
            i = domain.find(".", i + 1)
        return values.get("")


def parse_table(name, lines, meaning, parse):
    """(DomainTable, warnings) for the lines of control/NAME."""
    table, warnings = DomainTable(), []
    for raw in lines:
        line = raw.decode("utf-8", "surrogateescape")
        domain, colon, value = line.partition(":")
        domain = domain.strip().lower()
        try:
            if not colon or " " in domain:
                raise ValueError
            table.values[domain] = parse(value.strip())
        except ValueError:
            warnings.append("control/%s: ignoring line %r: want domain:%s" % (name, line, meaning))
    return table, warnings


class Rules:
    """The three tables; read() raises home.ControlError when a file exists but is unreadable."""

    def __init__(self, tables=None, warnings=()):
        self.tables = tables or [DomainTable() for _ in FILES]
        self.warnings = list(warnings)
        self.active = any(self.tables)

    @classmethod
    def read(cls, home):
        tables, warnings = [], []
        for name, meaning, parse in FILES:
            table, bad = parse_table(name, control_list(home, name, []), meaning, parse)
            tables.append(table)
            warnings.extend(bad)
        return cls(tables, warnings)

    def lookup(self, domain):
        """(concurrency or None, (messages, seconds) or None, delay seconds or None)."""
        return tuple(t.lookup(domain) for t in self.tables)
