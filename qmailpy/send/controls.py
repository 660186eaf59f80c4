"""The control files qmail-send reads (docs/control-files.md "Control files"): once at startup; SIGHUP rereads
locals, virtualdomains and the per-domain delivery rules (throttlerules.py)."""
from qmailpy.home import ControlError, control_int, control_list, control_me_default, control_value
from qmailpy.send.rewrite import Rewriter
from qmailpy.send.throttlerules import Rules
from qmailpy.states import DEFAULT_QUEUELIFETIME

SPAWN_MAX = 120


def _locals(home):
    lines = control_list(home, "locals")
    if lines is None:
        me = control_value(home, "me")
        if me is None:
            raise ControlError("neither control/locals nor control/me exists")
        lines = [me]
    return lines


def _concurrency(home, name, default):
    # qmail caps each channel at what its spawner reports (auto_spawn, 120)
    return control_int(home, name, default, high=SPAWN_MAX)


def read_rewriter(home):
    """The recipient rewriting qmail-send starts with (also `qmailctl queue list`'s, to
    show the messages it sets aside: backends/log/preprocess.py)."""
    return Rewriter(control_me_default(home, "envnoathost"), _locals(home),
                    control_list(home, "percenthack", []), control_list(home, "virtualdomains", []))


class SendControls:
    def __init__(self, home):
        self.home = home
        self.lifetime = control_int(home, "queuelifetime", DEFAULT_QUEUELIFETIME)
        self.concurrency = {"local": _concurrency(home, "concurrencylocal", 10),
                            "remote": _concurrency(home, "concurrencyremote", 20)}
        self.envnoathost = control_me_default(home, "envnoathost")
        self.bouncefrom = control_value(home, "bouncefrom", b"MAILER-DAEMON")
        self.bouncehost = control_me_default(home, "bouncehost")
        self.doublebouncehost = control_me_default(home, "doublebouncehost")
        self.doublebounceto = control_value(home, "doublebounceto", b"postmaster")
        self.percenthack = control_list(home, "percenthack", [])
        self.rewriter = read_rewriter(home)
        self.rules = Rules.read(home)

    def reread(self):
        """SIGHUP: new locals, virtualdomains and rules. Returns None, or the alert text on failure."""
        try:
            new_locals = _locals(self.home)
        except ControlError:
            return "unable to reread control/locals"
        try:
            vdoms = control_list(self.home, "virtualdomains", [])
        except ControlError:
            return "unable to reread control/virtualdomains"
        self.rewriter = Rewriter(self.envnoathost, new_locals, self.percenthack, vdoms)
        try:
            self.rules = Rules.read(self.home)
        except ControlError as e:
            return str(e).replace("unable to read", "unable to reread", 1)
        return None
