"""qmail-smtpd-listen [-c limit] [-s perclient] [-n uses] [-i seconds] [-l localname] HOST:PORT:
a listener for qmail-smtpd whose session workers serve many connections each (at most
`uses`, and none after `seconds` idle).

Per-client rules (tcprules' source format) come from control/smtpclients. Run with
SMTPAUTH=! in its environment it is a submission port (STARTTLS, then AUTH before MAIL).
"""
import os
import sys

USAGE = ("qmail-smtpd-listen: usage: qmail-smtpd-listen [ -c limit ] [ -s perclient ]"
         " [ -n uses ] [ -i seconds ] [ -l localname ] host:port\n")


def _parse(argv):
    from qmailpy.util.sgetopt import GetoptError, sgetopt
    try:
        opts, args = sgetopt(argv, "c:s:n:i:l:")
    except GetoptError:
        return None
    from qmailpy.workerserver import DEFAULT_MAX_IDLE, DEFAULT_MAX_USE
    numbers = {"c": 40, "s": None, "n": DEFAULT_MAX_USE, "i": DEFAULT_MAX_IDLE}
    local = None
    for opt, value in opts:
        if opt in numbers:
            if not value.isascii() or not value.isdigit() or int(value) < 1:
                return None
            numbers[opt] = int(value)
        elif opt == "l":
            local = value
    if len(args) != 1:
        return None
    host, sep, port = args[0].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port), numbers, local


def _warn(text):
    # Called in the accept loop: a lost log must not end the listener.
    try:
        sys.stderr.write("qmail-smtpd-listen: warning: %s; previous rules kept\n" % text)
        sys.stderr.flush()
    except OSError:
        pass


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parsed = _parse(argv)
    if parsed is None:
        sys.stderr.write(USAGE)
        return 100
    host, port, numbers, local = parsed
    from qmailpy.home import ControlError, control_value, qmail_home
    from qmailpy.clientrules import Rules
    from qmailpy.smtpd.listener import Listener
    # Loaded once here so that each session worker starts with them in memory.
    from qmailpy.smtpd import privileges, session
    from qmailpy import privs
    privileges.preload()
    home = qmail_home()
    from qmailpy.smtpd import tls
    if os.path.exists(tls.cert_path(home)):
        # ... and what STARTTLS and AUTH need, when a certificate makes them possible
        import importlib
        importlib.import_module("qmailpy.smtpd.auth")
        tls.preload()
    if os.path.exists(os.path.join(home, "control", "milters")):
        # ... and the milter client
        import importlib
        importlib.import_module("qmailpy.milter.filters")
    if os.path.exists(os.path.join(home, "control", "dnsbl")):
        # ... and the DNSBL lookups (dnspython takes 100+ ms to import)
        from qmailpy.smtpd import dnsbl
        dnsbl.preload()
    if os.path.exists(os.path.join(home, "control", "authcheck")):
        # ... and pyspf, dkimpy and authheaders for the SPF, DKIM and DMARC checks
        from qmailpy.smtpd import authcheck
        authcheck.preload()
    # ... and the accounts every session worker and queueing child switches to.
    from qmailpy.queue import qmailqueue
    qmailqueue.prepare(home)
    if local is None:
        try:
            me = control_value(home, "me")
        except ControlError:
            me = None
        local = me.decode("ascii", "replace") if me else None

    dropped = []

    def setup():
        # Once per worker: a worker that cannot give up root serves nobody.
        try:
            os.chdir(home)
            privileges.drop(home)
        except (OSError, privs.PrivError):
            return
        dropped.append(True)

    def handler(environ):
        if not dropped:
            os.write(1, session.R_CONTROLS)
            return 1
        try:
            os.chdir(home)
        except OSError:
            os.write(1, session.R_CONTROLS)
            return 1
        return session.serve(home, environ)

    rules = Rules(os.path.join(home, "control", "smtpclients"))
    error = rules.refresh()
    if error is not None:
        sys.stderr.write("qmail-smtpd-listen: fatal: %s\n" % error)
        return 111
    try:
        listener = Listener(host, port, handler, limit=numbers["c"], local_host=local,
                            rules=rules, warn=_warn, per_source=numbers["s"], setup=setup,
                            max_use=numbers["n"], max_idle=numbers["i"])
    except OSError as e:
        sys.stderr.write("qmail-smtpd-listen: fatal: unable to bind %s:%d: %s\n"
                         % (host, port, e.strerror))
        return 111

    def ready():
        sys.stderr.write("qmail-smtpd-listen: listening on %s:%d\n" % tuple(listener.address))
        sys.stderr.flush()

    return listener.serve(ready)


if __name__ == "__main__":
    sys.exit(main())
