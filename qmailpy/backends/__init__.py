"""Queue backends: 'dir' (qmail's own layout) and 'log' (log-structured), chosen by control/queuebackend."""
from qmailpy.home import control_value

BACKENDS = ("dir", "log")


def backend_name(home):
    name = (control_value(home, "queuebackend", b"dir") or b"dir").decode("ascii", "replace").strip()
    if name not in BACKENDS:
        raise ValueError("control/queuebackend names unknown backend %r" % name)
    return name


def open_backend(home, **options):
    """The QueueBackend configured for this home."""
    if backend_name(home) == "log":
        from qmailpy.backends.logqueue import LogQueue
        return LogQueue(home, **options)
    from qmailpy.backends.dir.queue import DirQueue
    return DirQueue(home, **options)
