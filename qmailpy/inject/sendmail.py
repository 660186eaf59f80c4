"""The sendmail wrapper's option handling (docs/submission.md "sendmail"), turned into qmail-inject options.

Exit statuses follow sendmail's <sysexits.h>, which the programs that call
/usr/sbin/sendmail (cron, mailx, mutt, git send-email, PHP) understand:
qmail-inject's 100 (usage, bad header or address, permanent queue refusal)
becomes EX_USAGE 64 for a usage error and EX_DATAERR 65 otherwise; 111
(temporary) becomes EX_TEMPFAIL 75, which callers report as "deferred, try
again" rather than as a hard failure.
"""
from qmailpy.inject.compose import ARGS, BOTH
from qmailpy.util.sgetopt import GetoptError, sgetopt

EX_OK, EX_USAGE, EX_DATAERR, EX_UNAVAILABLE, EX_TEMPFAIL = 0, 64, 65, 69, 75
USAGE = ("sendmail: usage: sendmail [ -t ] [ -f sender ] [ -F name ] [ -O DeliverAfter=time ] [ -bp ] [ -bs ]"
         " [ arg ... ]\n")

# Letters taking an argument; all but f, r, F, b and O DeliverAfter are accepted and ignored.
_OPTSTRING = "vimtxUe:f:r:p:o:O:B:F:b:N:R:"
_OPTIONAL = "EJ"          # optional attached argument (-J, -Jfoo)


def exit_status(inject_code):
    return {0: EX_OK, 100: EX_DATAERR}.get(inject_code, EX_TEMPFAIL)


class Request:
    """What the command line asks for: mode 'inject', 'queue' (-bp) or 'smtp' (-bs)."""

    def __init__(self):
        self.mode = "inject"
        self.strategy = ARGS
        self.sender = None
        self.name = None
        self.recipients = []
        self.not_before = None          # -O DeliverAfter=, epoch seconds


class UsageError(Exception):
    pass


def parse(argv):
    try:
        opts, args = sgetopt(argv, _OPTSTRING, _OPTIONAL)
    except GetoptError as e:
        raise UsageError(str(e))
    req = Request()
    for letter, value in opts:
        if letter == "t":
            req.strategy = BOTH
        elif letter in "fr":
            req.sender = value
        elif letter == "F":
            req.name = value
        elif letter == "b":
            if value.startswith("p"):
                req.mode = "queue"
            elif value.startswith("s"):
                req.mode = "smtp"
            elif not value.startswith("m"):
                raise UsageError("unsupported mode -b%s" % value)
        elif letter == "O":
            name, _, when = value.partition("=")
            if name.lower() == "deliverafter":
                req.not_before = deliver_after(when)
    req.recipients = args
    return req


def deliver_after(text, now=None):
    """-O DeliverAfter=: `+SECONDS` from now (RFC 4865's HOLDFOR) or a UTC time
    `YYYY-MM-DDTHH:MM:SSZ` (its HOLDUNTIL); epoch seconds (None for a time already past),
    UsageError otherwise."""
    import time
    now = time.time() if now is None else now
    if text[:1] == "+" and text[1:].isascii() and text[1:].isdigit() and len(text) <= 11:
        return int(now) + int(text[1:])
    import calendar
    try:
        when = calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        raise UsageError("bad -O DeliverAfter=%s: want +SECONDS or YYYY-MM-DDTHH:MM:SSZ" % text) from None
    # A time already past holds nothing: no $QMAILNOTBEFORE (one before 1970 is not digits,
    # and a past mtime would make the body look years old to the oldest-message metric).
    return when if when > now else None


def inject_environment(environ, req):
    """qmail's sendmail.c: -F sets MAILNAME; -f replaces the name and host variables."""
    env = dict(environ)
    if req.name is not None:
        env["MAILNAME"] = req.name
    if req.sender is not None:
        for name in ("QMAILNAME", "MAILNAME", "NAME", "QMAILHOST", "MAILHOST"):
            env.pop(name, None)
        user, at, host = req.sender.rpartition("@")
        if at:
            env["QMAILUSER"] = user
            env["QMAILHOST"] = host
        else:
            env["QMAILUSER"] = req.sender
    return env


def smtp_environment(environ):
    """-bs: a local SMTP session is trusted to relay, with no size limit."""
    env = dict(environ)
    if "PROTO" not in env:
        env.update(RELAYCLIENT="", DATABYTES="0", PROTO="TCP", TCPLOCALIP="127.0.0.1",
                   TCPLOCALHOST="localhost", TCPREMOTEIP="127.0.0.1",
                   TCPREMOTEHOST="localhost", TCPREMOTEINFO="sendmail-bs")
    return env
