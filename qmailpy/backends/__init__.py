"""Queue backends: 'dir' (qmail's own layout) and 'log' (log-structured), chosen by control/queuebackend."""
from qmailpy.queuebackend import BACKENDS, backend_name  # noqa: F401  (defined in the core)


def open_backend(home, **options):
    """The QueueBackend configured for this home."""
    if backend_name(home) == "log":
        from qmailpy.backends.log.queue import LogQueue
        return LogQueue(home, **options)
    from qmailpy.backends.dir.queue import DirQueue
    return DirQueue(home, **options)
