"""Which queued messages a `qmailctl queue` command acts on: one filter for every subcommand.

Usage (list, size, shape here; delete, hold, release, requeue, bounce likewise):

    from qmailpy.ctl import queuefilter
    queuefilter.add_arguments(parser)          # NUMBER... and the --options below
    wanted = queuefilter.from_args(args)       # a Filter; ArgumentTypeError never escapes:
                                               # argparse reports bad values (exit 2)
    for record in records:                     # snapshot message records (qmail-snapshot(5))
        if wanted(record):
            ...
    wanted.numbers                             # frozenset of the NUMBERs given, or None:
                                               # a walker may look those up directly, and a
                                               # caller reports those it did not find

A record is a snapshot_format.message_record dict: n, state, birth, size, sender,
recipients [{channel, address, done}], bouncing, ... . Every option given must
match (AND); numbers, and repeated --sender/--recipient/--recipient-domain/--state,
match any one of theirs (OR). Addresses and domains compare case-insensitively.
Recipient options look at pending recipients only (not done), as qshape does.

States (--state): new = queued, not yet preprocessed (S4, qmail's todo/);
preprocessed = S5 (qmail's info/); local, remote = S5 with a pending recipient
on that channel; held = kept back by `qmailctl queue hold` (record field "held");
set-aside = new, and qmail-send sets it aside (record field "set_aside": why).
"""
import argparse
import re
import time

from qmailpy import command, states

STATE_NAMES = ("new", "preprocessed", "held", "local", "remote", "set-aside")

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZES = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def _amount(text, units, what):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]?)\s*", text)
    if not m or m.group(2).lower() not in units:
        raise argparse.ArgumentTypeError(
            "%r is not a %s (a number with an optional unit: %s)"
            % (text, what, " ".join(u for u in units if u)))
    return float(m.group(1)) * units[m.group(2).lower()]


def age(text):
    """'90', '90s', '30m', '2h', '1d', '1w' -> seconds."""
    return _amount(text, _UNITS, "duration")


def size(text):
    """'500', '10k', '2M', '1G' -> bytes (powers of 1024)."""
    return int(_amount(text, _SIZES, "size"))


def number(text):
    if not (text.isascii() and text.isdigit()) or not command.check_number(int(text)):
        raise argparse.ArgumentTypeError("%r is not a message number" % text)
    return int(text)


def add_arguments(parser):
    parser.add_argument("numbers", nargs="*", type=number, metavar="NUMBER",
                        help="only these message numbers (as qmail-qread shows them after #)")
    parser.add_argument("--sender", action="append", metavar="ADDR",
                        help="envelope sender is ADDR ('' for bounces)")
    parser.add_argument("--recipient", action="append", metavar="ADDR",
                        help="a pending recipient is ADDR")
    parser.add_argument("--recipient-domain", action="append", metavar="DOMAIN",
                        help="a pending recipient is at DOMAIN (.DOMAIN: or below it)")
    parser.add_argument("--older-than", type=age, metavar="AGE",
                        help="queued more than AGE ago (90s, 30m, 2h, 1d, 1w)")
    parser.add_argument("--newer-than", type=age, metavar="AGE",
                        help="queued less than AGE ago")
    parser.add_argument("--state", action="append", choices=STATE_NAMES,
                        help="in this state (new, preprocessed, held, local, remote, set-aside)")
    parser.add_argument("--min-size", type=size, metavar="BYTES",
                        help="message at least BYTES long (k, M, G suffixes)")
    parser.add_argument("--max-size", type=size, metavar="BYTES",
                        help="message at most BYTES long")


def _lower(value):
    return value.lower() if isinstance(value, str) else value


def domain_of(address):
    """The domain of an address as the filters and qshape see it ('' when none)."""
    return address.rpartition("@")[2].lower() if "@" in address else ""


def pending(record):
    """The recipients of a record not yet done."""
    return [r for r in record["recipients"] if not r["done"]]


def record_states(record):
    """The STATE_NAMES a snapshot message record is in."""
    found = set()
    if record.get("state") == states.S4:
        found.add("new")
    elif record.get("state") in (states.S5, states.HELD):      # held: S5 kept back
        found.add("preprocessed")
        for r in pending(record):
            if r["channel"] in ("local", "remote"):
                found.add(r["channel"])
    if record.get("held"):
        found.add("held")
    if record.get("set_aside"):
        found.add("set-aside")
    return found


class Filter:
    """A predicate over snapshot message records; see the module docstring."""

    def __init__(self, numbers=(), senders=None, recipients=None, domains=None,
                 older_than=None, newer_than=None, state_names=None, min_size=None,
                 max_size=None, now=None):
        self.numbers = frozenset(numbers) if numbers else None
        self.senders = {s.lower() for s in senders} if senders is not None else None
        self.recipients = {r.lower() for r in recipients} if recipients is not None else None
        self.domains = [d.lower() for d in domains] if domains is not None else None
        self.older_than, self.newer_than = older_than, newer_than
        self.state_names = set(state_names) if state_names else None
        self.min_size, self.max_size = min_size, max_size
        self.now = time.time() if now is None else now

    def _domain_matches(self, domain):
        return any(domain == d or d.startswith(".") and domain.endswith(d) for d in self.domains)

    def __call__(self, record):
        if self.numbers is not None and record["n"] not in self.numbers:
            return False
        if self.senders is not None and _lower(record.get("sender")) not in self.senders:
            return False
        if self.recipients is not None or self.domains is not None:
            rcpts = pending(record)
            if self.recipients is not None and not any(
                    r["address"].lower() in self.recipients for r in rcpts):
                return False
            if self.domains is not None and not any(
                    self._domain_matches(domain_of(r["address"])) for r in rcpts):
                return False
        birth = record.get("birth")
        if self.older_than is not None and (birth is None or self.now - birth <= self.older_than):
            return False
        if self.newer_than is not None and (birth is None or self.now - birth >= self.newer_than):
            return False
        if self.state_names is not None and not (self.state_names & record_states(record)):
            return False
        length = record.get("size")
        if self.min_size is not None and (length is None or length < self.min_size):
            return False
        if self.max_size is not None and (length is None or length > self.max_size):
            return False
        return True


def from_args(args, now=None):
    """The Filter of the options add_arguments() defined."""
    return Filter(args.numbers, args.sender, args.recipient, args.recipient_domain,
                  args.older_than, args.newer_than, args.state, args.min_size, args.max_size,
                  now=now)
