"""qmail-smtpd-listen's start (qmail-smtpd-listen(8)): what every session worker needs loaded
before it forks, the worker's switch from root to qmaild, the rules, the listening socket.

Started as root it binds the port and keeps root only in the listener; each session
worker gives it up once, before its first session (qmailpy.smtpd.privileges.drop).
"""
import os
import sys

from qmailpy import privs
from qmailpy.clientrules import Rules
from qmailpy.home import ControlError, control_value, qmail_home
from qmailpy.smtpd.listener import Listener
# Loaded once here so that each session worker starts with them in memory.
from qmailpy.smtpd import privileges, session


def run(host, port, numbers, local):
    """Set up and serve until told to stop; the exit status. numbers: -c, -s, -n, -i;
    local: -l's name, else control/me."""
    home = qmail_home()
    preload(home)
    if local is None:
        local = _me(home)
    setup, handler = _session_worker(home)
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


def _warn(text):
    # Called in the accept loop: a lost log must not end the listener.
    try:
        sys.stderr.write("qmail-smtpd-listen: warning: %s; previous rules kept\n" % text)
        sys.stderr.flush()
    except OSError:
        pass


def preload(home):
    """Import, once in the listener, what its session workers will need, so each starts
    with it in memory."""
    privileges.preload()
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


def _me(home):
    """control/me, the local host name sessions give (TCPLOCALHOST), else None."""
    try:
        me = control_value(home, "me")
    except ControlError:
        me = None
    return me.decode("ascii", "replace") if me else None


def _session_worker(home):
    """(setup, handler): a worker's one switch from root to qmaild, and its sessions."""
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

    return setup, handler
