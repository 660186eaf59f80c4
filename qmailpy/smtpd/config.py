"""What qmail-smtpd reads at connection start: control files and the tcpserver environment."""
import os

from qmailpy.home import ControlError, control_int, control_list, control_value, readint
from qmailpy.queuelimits import read_maxrcpt


class SetupError(Exception):
    """The controls cannot be read: the session answers 421 and ends."""


class SmtpdConfig:
    def __init__(self, home, environ):
        try:
            me = control_value(home, "me")
            self.greeting = control_value(home, "smtpgreeting", me)
            if self.greeting is None:
                raise SetupError("no control/smtpgreeting and no control/me")
            self.liphost = control_value(home, "localiphost", me)
            self.timeout = control_int(home, "timeoutsmtpd", 1200, low=1)     # qmail: 0 -> 1
            # deadlines for the whole session and for one DATA, in seconds (0: none)
            self.session_deadline = control_int(home, "timeoutsmtpdsession", 3600)
            self.data_deadline = control_int(home, "timeoutsmtpddata", 1200)
            self.databytes = control_int(home, "databytes", 0)
            self.maxrcpt = read_maxrcpt(home)          # the queue's cap (qmailpy.queuelimits)
            rcpthosts = control_list(home, "rcpthosts")
            self.rcpthosts = None if rcpthosts is None else {h.lower() for h in rcpthosts}
            bmf = control_list(home, "badmailfrom")
            self.badmailfrom = {b.lower() for b in bmf} if bmf else set()
        except ControlError as e:
            raise SetupError(str(e)) from e
        self.more_path = os.path.join(home, "control", "morercpthosts.cdb")
        if self.rcpthosts is not None:
            try:
                os.stat(self.more_path)
            except FileNotFoundError:
                self.more_path = None
            except OSError as e:
                raise SetupError(str(e)) from e
        else:
            self.more_path = None
        value = environ.get("DATABYTES")
        if value is not None:           # qmail: scan_ulong(x, &u), 0 when no digits
            self.databytes = readint(value, 0)

        def env(name):
            v = environ.get(name)
            return None if v is None else os.fsencode(v)

        def first(*values):
            return next((v for v in values if v is not None), b"unknown")

        self.remoteip = first(env("TCPREMOTEIP"))
        self.localhost = first(env("TCPLOCALHOST"), env("TCPLOCALIP"))
        self.remotehost = first(env("TCPREMOTEHOST"))
        self.remoteinfo = env("TCPREMOTEINFO")
        self.relayclient = env("RELAYCLIENT")
        # AUTH offered (in TLS) when set; "!..." also requires it before MAIL (the AUTH patches' form)
        self.smtpauth = env("SMTPAUTH")
        self.auth_required = self.smtpauth is not None and self.smtpauth.startswith(b"!")
        self._more = None

    def more_lookup(self):
        """A function key -> bool over morercpthosts.cdb, or None (loaded on first use)."""
        if self.more_path is None:
            return None
        if self._more is None:
            from qmailpy.util.cdb import CDB
            try:
                self._more = CDB.open(self.more_path)
            except (OSError, ValueError) as e:
                raise SetupError(str(e)) from e
        return self._more.__contains__
