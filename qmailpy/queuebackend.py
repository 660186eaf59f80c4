"""control/queuebackend: which queue backend a home uses, 'dir' (qmail's own layout, the
default) or 'log' (log-structured). The backends themselves are qmailpy.backends."""
from qmailpy.home import control_value

BACKENDS = ("dir", "log")


def backend_name(home):
    name = (control_value(home, "queuebackend", b"dir") or b"dir").decode("ascii", "replace").strip()
    if name not in BACKENDS:
        raise ValueError("control/queuebackend names unknown backend %r" % name)
    return name
