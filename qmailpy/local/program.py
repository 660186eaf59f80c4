"""Delivery to a program: ``|command`` runs as /bin/sh -c command (docs/delivery.md "qmail-local").

The program runs in the home directory with qmail-local's environment, the
message on stdin (as stored: no Return-Path or Delivered-To added) and
qmail-local's stdout/stderr, which become the delivery report. SIGPIPE (and
SIGXFSZ, which Python ignores) are back to their defaults for it.
"""
import errno
import os
import signal

from qmailpy.local.errors import Failure, error_str

SHELL = b"/bin/sh"
PERMANENT = frozenset((100, 64, 65, 70, 76, 77, 78, 112))
CRASHED = b"Aack, child crashed. (#4.3.0)"
SKIP_REST = 99


def run(command, env, msgfd):
    """Run one program line; True if it exited 99 (ignore the lines after it).

    Exit 0 and 99 succeed; 100, 64, 65, 70, 76, 77, 78 and 112 end the
    delivery permanently (exit 100), any other status or a signal temporarily
    (111). The program's own output is the only report text for those.
    """
    actions = [] if msgfd == 0 else [(os.POSIX_SPAWN_DUP2, msgfd, 0)]
    try:
        pid = os.posix_spawn(SHELL, [SHELL, b"-c", command], env, file_actions=actions,
                             setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.ENOMEM):      # the fork failed
            raise Failure(111, b"Unable to fork: " + error_str(e) + b". (#4.3.0)") from e
        raise Failure(111, b"Unable to run /bin/sh: " + error_str(e) + b". (#4.3.0)") from e
    _, wstat = os.waitpid(pid, 0)
    if os.WIFSIGNALED(wstat):
        raise Failure(111, CRASHED)
    code = os.WEXITSTATUS(wstat)
    if code == 0:
        return False
    if code == SKIP_REST:
        return True
    raise Failure(100 if code in PERMANENT else 111, None)
