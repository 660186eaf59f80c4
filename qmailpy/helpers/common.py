"""What the delivery helpers share (docs/delivery.md "Delivery helpers").

run_main() turns a Failure(code, text) into qmail's exit: the text and a
newline on fd 2 (say()), then the code. fatal() words a text as qmail's strerr does
(`preline: fatal: unable to fork: out of memory`). spawn() and outcome() run a
program qmail's way: found through PATH, SIGPIPE back to its default (Python
ignores it, a C parent would not have), and an exec that fails counting as the
program exiting 111 (a temporary errno) or 100. requeue() puts DTLINE and the
message on stdin back into the queue with qmail-local's own code.

Imports stay to os, _signal and qmailpy.local.errors: these run once per delivery.
"""
import errno
import os
import _signal
import sys

from qmailpy.local.errors import Failure, error_str, error_temp

_DEFAULT_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ)   # _signal: no enum import


def fatal(prog, *parts):
    return prog + b": fatal: " + b"".join(parts)


def say(text):
    """One line on fd 2, which qmail-local makes part of the delivery report."""
    try:
        os.write(2, text + b"\n")
    except OSError:
        pass                            # nobody listening: the exit code still tells


def run_main(body, argv):
    """body(argv as bytes) returns an exit code or raises Failure."""
    args = [os.fsencode(a) for a in (sys.argv[1:] if argv is None else argv)]
    try:
        return body(args)
    except Failure as f:
        say(f.text)
        return f.code


def spawn(prog, argv, stdin=None):
    """Start argv (argv[0] searched in PATH), with fd stdin as its fd 0 if given; its pid,
    or (None, exit code an exec failure stands for, the OSError)."""
    actions = [] if stdin is None else [(os.POSIX_SPAWN_DUP2, stdin, 0)]
    try:
        return os.posix_spawnp(argv[0], argv, os.environb, file_actions=actions,
                               setsigdef=_DEFAULT_SIGNALS), None
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.ENOMEM):      # the fork itself failed
            raise Failure(111, fatal(prog, b"unable to fork: ", error_str(e))) from e
        return None, e


def wait(prog, pid):
    """The exit code of child pid; a child killed by a signal is a temporary failure."""
    _, wstat = os.waitpid(pid, 0)
    if os.WIFSIGNALED(wstat):
        raise Failure(111, fatal(prog, b"child crashed"))
    return os.WEXITSTATUS(wstat)


def outcome(prog, argv):
    """Run argv with our stdin: True if it exited 0, False for any other code but 111,
    which (like a crash) is a temporary failure of ours. A program that cannot be
    run exits 111 or 100 as qmail's child would after a failed exec."""
    pid, error = spawn(prog, argv)
    if pid is None:
        code = 111 if error_temp(error) else 100
    else:
        code = wait(prog, pid)
    if code == 111:
        raise Failure(111, fatal(prog, b"temporary child error"))
    return code == 0


def requeue(prog, sender_variable, recipients):
    """Queue $DTLINE + the message on fd 0 from the sender in $sender_variable; the qp."""
    sender = os.environb.get(sender_variable)
    if sender is None:
        raise Failure(100, fatal(prog, sender_variable, b" not set"))
    dtline = os.environb.get(b"DTLINE")
    if dtline is None:
        raise Failure(100, fatal(prog, b"DTLINE not set"))
    from qmailpy.home import qmail_home
    from qmailpy.local.forward import ReadError, requeue as queue_message
    from qmailpy.queue.client import QueueStartError
    try:
        result = queue_message(qmail_home(), 0, dtline, sender, recipients)
    except QueueStartError as e:
        raise Failure(111, fatal(prog, b"unable to fork: ", error_str(e))) from e
    except ReadError as e:
        raise Failure(111, fatal(prog, b"unable to read message: ", error_str(e))) from e
    if not result.ok:
        raise Failure(100 if result.permanent else 111, fatal(prog, result.text))
    return result.pid
