"""A qmail-send that SIGKILLs itself right after its K-th log record append (crash tests only).

install_wrapper(bindir, k) writes an executable `qmail-send` into bindir; with bindir
first in PATH, qmail-start execs it instead of the real program. It wraps the log
backend's append (Segments.append, backends/log/segments.py) so that the K-th record
that reaches its segment file is followed by SIGKILL, then runs the real qmail-send's
main(). Only appends of this process count, not those of a qmail-queue it starts for a bounce.
"""
import os
import signal
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def kill_after_appends(k):
    from qmailpy.backends.log.segments import Segments
    append = Segments.append
    count = 0

    def append_then_maybe_die(self, data, durable=False):
        nonlocal count
        pos = append(self, data, durable)
        count += 1
        if count >= k:
            os.kill(os.getpid(), signal.SIGKILL)
        return pos
    Segments.append = append_then_maybe_die


def install_wrapper(bindir, k):
    """Write bindir/qmail-send that dies after its k-th append; returns its path."""
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, "qmail-send")
    with open(path, "w") as f:
        f.write("#!%s\nimport sys\nsys.path.insert(0, %r)\nimport qmail_send_kill_at\n"
                "sys.exit(qmail_send_kill_at.main(%d))\n" % (sys.executable, TESTS_DIR, k))
    os.chmod(path, 0o755)
    return path


def main(k):
    kill_after_appends(k)
    from qmailpy.cli.qmail_send import main as qmail_send
    return qmail_send()
