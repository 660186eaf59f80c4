"""qmail-inject's environment variables and control files (docs/submission.md "qmail-inject"; docs/control-files.md "Control files")."""
import os

from qmailpy.home import control_me_default


class InjectSettings:
    def __init__(self, home, environ, name=None):
        """name: an explicit full name (-F), above QMAILNAME/MAILNAME/NAME."""
        def env(*names):
            for n in names:
                value = environ.get(n)
                if value is not None:
                    return os.fsencode(value)
            return None

        self.user = env("QMAILUSER", "MAILUSER", "USER", "LOGNAME") or b"anonymous"
        self.host = env("QMAILHOST", "MAILHOST")
        self.name = os.fsencode(name) if name is not None else env("QMAILNAME", "MAILNAME", "NAME")
        self.suser = env("QMAILSUSER")
        self.shost = env("QMAILSHOST")
        self.flags = (environ.get("QMAILINJECT") or "")
        self.defaultdomain = env("QMAILDEFAULTDOMAIN") or control_me_default(home, "defaultdomain")
        self.defaulthost = env("QMAILDEFAULTHOST") or control_me_default(home, "defaulthost")
        self.plusdomain = env("QMAILPLUSDOMAIN") or control_me_default(home, "plusdomain")
        self.idhost = env("QMAILIDHOST") or control_me_default(home, "idhost")
        self.mft = None
        mftfile = environ.get("QMAILMFTFILE")
        if mftfile:
            # The file names mailing lists: one address a line.
            self.mft = {line.lower() for line in _read_list(mftfile)}

    def flag(self, letter):
        return letter in self.flags


def _read_list(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return [line.strip() for line in data.split(b"\n") if line.strip() and not line.startswith(b"#")]
