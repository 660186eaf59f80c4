"""qmail-showctl: what every control file says, or the default it falls back to (qmail-showctl(8)).

The output is qmail-showctl's, line for line: the compiled-in facts (here the
home's control/roles and qmailpy's constants), then each of qmail's control
files as ``\\nNAME: TEXT\\n``, with "(Default.) " when the file is absent and
control bytes and non-ASCII shown as '?'. qmailpy's own control files follow
under a heading of their own, in the same form, then every other file in
control/ with "I have no idea what this file does." (in sorted order; qmail
lists them in readdir order). Exit 0; 111 when the home or control/ cannot be
entered or read, or control/me cannot be read.
"""
import os
import sys

# (kind, name, default, prefix, suffix); kind "int", "str" or "me" (a str whose default is control/me),
# "lst" (suffix after each line). The texts are qmail-showctl.c's.
QMAIL_FILES = (
    ("lst", "badmailfrom", "Any MAIL FROM is allowed.", "", " not accepted in MAIL FROM."),
    ("str", "bouncefrom", "MAILER-DAEMON", "Bounce user name is ", ""),
    ("me", "bouncehost", "bouncehost", "Bounce host name is ", ""),
    ("int", "concurrencylocal", "10", "Local concurrency is ", ""),
    ("int", "concurrencyremote", "20", "Remote concurrency is ", ""),
    ("int", "databytes", "0", "SMTP DATA limit is ", " bytes"),
    ("me", "defaultdomain", "defaultdomain", "Default domain name is ", ""),
    ("me", "defaulthost", "defaulthost", "Default host name is ", ""),
    ("me", "doublebouncehost", "doublebouncehost", "2B recipient host: ", ""),
    ("str", "doublebounceto", "postmaster", "2B recipient user: ", ""),
    ("me", "envnoathost", "envnoathost", "Presumed domain name is ", ""),
    ("me", "helohost", "helohost", "SMTP client HELO host name is ", ""),
    ("me", "idhost", "idhost", "Message-ID host name is ", ""),
    ("me", "localiphost", "localiphost", "Local IP address becomes ", ""),
    ("lst", "locals", "Messages for me are delivered locally.", "Messages for ", " are delivered locally."),
    ("str", "me", "undefined! Uh-oh", "My name is ", ""),
    ("lst", "percenthack", "The percent hack is not allowed.", "The percent hack is allowed for user%host@", "."),
    ("me", "plusdomain", "plusdomain", "Plus domain name is ", ""),
    ("lst", "qmqpservers", "No QMQP servers.", "QMQP server: ", "."),
    ("int", "queuelifetime", "604800", "Message lifetime in the queue is ", " seconds"),
    ("rcpthosts",),
    ("me", "smtpgreeting", "smtpgreeting", "SMTP greeting: 220 ", ""),
    ("lst", "smtproutes", "No artificial SMTP routes.", "SMTP route: ", ""),
    ("int", "timeoutconnect", "60", "SMTP client connection timeout is ", " seconds"),
    ("int", "timeoutremote", "1200", "SMTP client data timeout is ", " seconds"),
    ("int", "timeoutsmtpd", "1200", "SMTP server data timeout is ", " seconds"),
    ("lst", "virtualdomains", "No virtual domains.", "Virtual domain: ", ""),
)
RCPTHOSTS_NAMES = ("rcpthosts", "morercpthosts", "morercpthosts.cdb")

HEADING = "\n\n\nNow qmailpy's own files:\n"


def qmailpy_files():
    """qmailpy's control files (docs/control-files.md "Control files"), in qmail-showctl's form;
    the defaults come from the modules that read the files."""
    from qmailpy.backends.log.commit import SEGMENT_LIMIT, SEGMENT_LIMIT_CONTROL
    from qmailpy.ctl.logwriter import COUNT_CONTROL, DEFAULT_COUNT, DEFAULT_SIZE, SIZE_CONTROL
    from qmailpy.queuelimits import DEFAULT_MAXRCPT, MAXRCPT_CONTROL
    from qmailpy.send.metrics import DEFAULT_INTERVAL as METRICS_INTERVAL, INTERVAL_CONTROL as METRICS_CONTROL
    from qmailpy.resolver import CONTROL as DNS_CONTROL, DEFAULT_TIMEOUT as DNS_TIMEOUT, TIMEOUT_CONTROL
    from qmailpy.remote.tls import CONTROL as TLS_CONTROL
    from qmailpy.smtpd.auth import DEFAULT_TIMEOUT as CHECKPASSWORD_TIMEOUT
    from qmailpy.smtpd.authcheck import CONTROL as AUTHCHECK, DMARC_REJECT, SPF_REJECT
    from qmailpy.smtpd.tls import CERT, DEFAULT_HANDSHAKE_TIMEOUT
    return (
        ("lst", AUTHCHECK, "No SPF, DKIM or DMARC checks of incoming mail.",
         "Incoming mail check (an empty file: all three): ", ""),
        ("lst", "checkpassword", "No checkpassword program; SMTP AUTH is not offered.",
         "SMTP AUTH passwords are checked by ", ""),
        ("lst", "concurrencydomains", "No per-domain concurrency limits.", "Concurrency limit: ", ""),
        ("lst", "delaydomains", "No per-domain delivery delays.", "Delivery delay: ", ""),
        ("lst", "dnsbl", "No DNSBL zones are consulted.", "DNSBL zone: ", ""),
        ("lst", "dkimkeys", "No DKIM keys; outgoing mail is not signed.", "DKIM key: ", ""),
        ("int", DMARC_REJECT, "0", "DMARC fail under p=reject refused is ", " (1: yes)"),
        ("lst", "milters", "No milters; mail from SMTP is not filtered.", "Milter: ", ""),
        ("lst", DNS_CONTROL, "DNS servers are those of /etc/resolv.conf.", "DNS server: ", "."),
        ("int", "localdatabytes", "0", "Local users' message size limit is ", " bytes (0: none)"),
        ("int", COUNT_CONTROL, str(DEFAULT_COUNT), "Rotated log files kept: ", ""),
        ("int", SEGMENT_LIMIT_CONTROL, str(SEGMENT_LIMIT), "Log queue segment size limit is ", " bytes"),
        ("int", SIZE_CONTROL, str(DEFAULT_SIZE), "Log files rotate past ", " bytes"),
        ("int", MAXRCPT_CONTROL, str(DEFAULT_MAXRCPT), "Recipients per message are at most ", " (0: no count)"),
        ("int", METRICS_CONTROL, str(METRICS_INTERVAL), "Metrics are written every ", " seconds"),
        ("lst", "outgoingip", "Outgoing connections bind to no particular address.",
         "Outgoing connections bind to ", "."),
        ("int", "pop3requiretls", "0", "POP3 passwords in clear from other hosts refused is ", " (1: yes)"),
        ("str", "queuebackend", "dir", "Queue backend is ", ""),
        ("lst", "ratelimits", "No per-domain rate limits.", "Rate limit: ", ""),
        ("lst", "roles", "Every role uses qmail's own account name.", "Role account: ", ""),
        ("exists", CERT, "No certificate; STARTTLS is not offered.",
         "A certificate is present; STARTTLS is offered when qmaild can read it.", ""),
        ("lst", "smtpclients", "No per-client rules for qmail-smtpd-listen.", "SMTP client rule: ", ""),
        ("int", SPF_REJECT, "0", "SPF fail refused at MAIL is ", " (1: yes)"),
        ("int", "timeoutcheckpassword", str(CHECKPASSWORD_TIMEOUT), "checkpassword timeout is ", " seconds"),
        ("int", TIMEOUT_CONTROL, str(DNS_TIMEOUT), "DNS lookup timeout is ", " seconds"),
        ("int", "timeoutremotesession", "3600", "SMTP client session deadline is ", " seconds"),
        ("int", "timeoutsmtpddata", "1200", "SMTP server DATA deadline is ", " seconds"),
        ("int", "timeoutsmtpdsession", "3600", "SMTP server session deadline is ", " seconds"),
        ("int", "timeoutsmtpdtls", str(DEFAULT_HANDSHAKE_TIMEOUT), "SMTP server TLS handshake timeout is ",
         " seconds"),
        ("lst", TLS_CONTROL, "No domain requires verified TLS.", "TLS destination: ", ""),
    )


def safe(data):
    """qmail's safeput: bytes outside 32..126 become '?'."""
    return "".join(chr(b) if 32 <= b <= 126 else "?" for b in data)


class Reader:
    """Reads control files the way qmail's control.c does, relative to HOME/control."""

    def __init__(self, home):
        self.home = home

    def _read(self, read, name):
        """(1, value) / (0, None) absent / (-1, None) unreadable."""
        from qmailpy.home import ControlError
        try:
            value = read(self.home, name)
        except ControlError:
            return -1, None
        return (0, None) if value is None else (1, value)

    def line(self, name):
        from qmailpy.home import control_value
        return self._read(control_value, name)

    def number(self, name):
        """qmail's control_readint: the leading digits; none (or no file) is the default."""
        from qmailpy.home import scan_ulong
        status, value = self.line(name)
        if status != 1:
            return status, None
        number = scan_ulong(value)
        return (0, None) if number is None else (1, number)

    def lines(self, name):
        from qmailpy.home import control_list
        return self._read(control_list, name)


def show(out, reader, entry, me):
    kind, name = entry[0], entry[1]
    if kind == "lst":
        return show_list(out, reader, *entry[1:])
    out.append("\n%s: " % name)
    default, pre, post = entry[2:]
    if kind == "exists":
        status = 1 if os.path.lexists(os.path.join(reader.home, "control", name)) else 0
        out.append(pre + ".\n" if status else "(Default.) " + default + "\n")
        return status
    if kind == "int":
        status, value = reader.number(name)
        if status == 1:
            out.append("%s%d%s.\n" % (pre, value, post))
        elif status == 0:
            out.append("(Default.) %s%s%s.\n" % (pre, default, post))
        else:
            out.append("Oops! Trouble reading this file.\n")
        return status
    status, value = reader.line(name)
    if status == -1:
        out.append("Oops! Trouble reading this file.\n")
        return status
    if status == 0:
        out.append("(Default.) ")
        value = me if kind == "me" and me is not None else default.encode()
    out.append(pre + safe(value) + post + ".\n")
    return status


def show_list(out, reader, name, default, pre, post):
    out.append("\n%s: " % name)
    status, lines = reader.lines(name)
    if status == 1:
        out.append("\n")
        out.extend(pre + safe(line) + post + "\n" for line in lines)
    elif status == 0:
        out.append("(Default.) %s\n" % default)
    else:
        out.append("Oops! Trouble reading this file.\n")
    return status


def show_rcpthosts(out, reader, control):
    if show_list(out, reader, "rcpthosts", "SMTP clients may send messages to any recipient.",
                 "SMTP clients may send messages to recipients at ", ".") == 1:
        show_list(out, reader, "morercpthosts", "No effect.",
                  "SMTP clients may send messages to recipients at ", ".")
    else:
        show_list(out, reader, "morercpthosts", "No rcpthosts; morercpthosts is irrelevant.",
                  "No rcpthosts; doesn't matter that morercpthosts has ", ".")
    out.append("\nmorercpthosts.cdb: ")
    plain, cdb = _stat(control, "morercpthosts"), _stat(control, "morercpthosts.cdb")
    if plain is None:
        out.append("(Default.) No effect.\n" if cdb is None
                   else "Oops! morercpthosts.cdb exists but morercpthosts doesn't.\n")
    elif cdb is None:
        out.append("Oops! morercpthosts exists but morercpthosts.cdb doesn't.\n")
    elif int(plain.st_mtime) > int(cdb.st_mtime):
        out.append("Oops! morercpthosts.cdb is older than morercpthosts.\n")
    else:
        out.append("Modified recently enough; hopefully up to date.\n")


def _stat(control, name):
    try:
        return os.stat(os.path.join(control, name))
    except OSError:
        return None


def compiled_in(home):
    """The first lines: what qmail compiles in and qmailpy keeps in constants and control/roles
    (the ids only when control/ can be read: they come from control/roles)."""
    from qmailpy.layout import SPLIT
    from qmailpy.local.dotqmail import PATERNALISM
    from qmailpy.spawn import SLOTS
    return ["qmail home directory: %s.\n" % home,
            "user-ext delimiter: -.\n",
            "paternalism (in decimal): %d.\n" % PATERNALISM,
            "silent concurrency limit: %d.\n" % SLOTS,
            "subdirectory split: %d.\n" % SPLIT]


def account_ids(home):
    from qmailpy import privs
    roles = privs.load_roles(home)
    users = [roles[r] for r in ("alias", "qmaild", "qmaill")] + ["root"] \
        + [roles[r] for r in ("qmailp", "qmailq", "qmailr", "qmails")]
    uids = [str(privs.uid_of_name(name)) for name in users]
    gids = [str(privs.gid_of_name(roles[g])) for g in ("nofiles", "qmail")]
    return ["user ids: %s.\n" % ", ".join(uids), "group ids: %s.\n" % ", ".join(gids)]


def report(home):
    """(the text, exit code)."""
    from qmailpy import privs
    out = compiled_in(home)
    control = os.path.join(home, "control")
    if not os.path.isdir(home):
        return "".join(out) + "Oops! Unable to chdir to %s.\n" % home, 111
    try:
        names = os.listdir(control)
    except (FileNotFoundError, NotADirectoryError):
        return "".join(out) + "Oops! Unable to chdir to control.\n", 111
    except OSError:
        return "".join(out) + "Oops! Unable to open current directory.\n", 111
    try:
        out += account_ids(home)
    except (privs.PrivError, OSError) as e:
        return "".join(out) + "Oops! %s.\n" % e, 111
    reader = Reader(home)
    status, me = reader.line("me")
    if status == -1:
        return "".join(out) + "Oops! Trouble reading control/me.", 111
    known = set(RCPTHOSTS_NAMES)
    for entry in QMAIL_FILES:
        if entry[0] == "rcpthosts":
            show_rcpthosts(out, reader, control)
            continue
        show(out, reader, entry, me)
        known.add(entry[1])
    out.append(HEADING)
    for entry in qmailpy_files():
        show(out, reader, entry, me)
        known.add(entry[1])
    for name in sorted(set(names) - known):
        out.append("\n%s: I have no idea what this file does.\n" % name)
    return "".join(out), 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        sys.stderr.write("usage: qmail-showctl\n")
        return 100
    from qmailpy.home import qmail_home
    text, code = report(qmail_home())
    sys.stdout.buffer.write(text.encode("latin-1"))
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
