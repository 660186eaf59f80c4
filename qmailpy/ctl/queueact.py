"""qmailctl queue delete | hold | release | requeue | bounce: act on messages through the
running qmail-send (docs/qmail-send.md "Commands"), never behind its back.

The messages are NUMBERs or the filters of queuefilter.py (at least one of them).
qmailctl writes one command into queue/command/, pulls the trigger and waits for
qmail-send's answer, one line per message: those acted on go to stdout, the others
to stderr with the reason. Exit codes: 0 every message acted on; 1 some were not
(not in the queue, not held, ...) or a filter matched none; 2 bad usage; 111
some were not for a reason that passes (a queue error, not yet preprocessed: try
again), or nothing was done because qmail-send is not running or did not take the
command in --timeout seconds, or qmail-send stopped or is still busy with it (said
on stderr: it finishes the command itself).
"""
import fcntl
import os
import sys
import time

from qmailpy import command, nofollow, trigger
from qmailpy.ctl import queuefilter

HELP = "act on queued messages through qmail-send (delete, hold, release, requeue, bounce)"
EXIT_NOT_DONE, EXIT_USAGE, EXIT_TEMP = 1, 2, 111
DEFAULT_TIMEOUT = 300.0
_FILTERS = ("senders", "recipients", "domains", "older_than", "newer_than", "state_names",
            "min_size", "max_size")


def add_arguments(parser):
    queuefilter.add_arguments(parser)
    parser.add_argument("--reason", metavar="TEXT",
                        help="bounce only: the failure text the bounce gives for each recipient")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="how long to wait for qmail-send (default %d)" % DEFAULT_TIMEOUT)


def _say(action, text):
    print("qmailctl queue %s: %s" % (action, text), file=sys.stderr)


def send_running(home):
    """True while a qmail-send holds lock/sendmutex. nofollow.Refused when lock/ or
    sendmutex is not what it should be (a symlink, a FIFO: root must not wait on one)."""
    try:
        lock = nofollow.open_path(home, os.path.join("queue", "lock"))
    except nofollow.Refused:
        raise
    except OSError:
        return False
    try:
        fd = nofollow.open_file("sendmutex", lock)
    except nofollow.Refused:
        raise
    except OSError:
        return False
    finally:
        os.close(lock)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def select_numbers(home, wanted):
    """The message numbers to name in the command: the NUMBERs as given, or what the
    filters select from the queue as it is now."""
    if not any(getattr(wanted, f) is not None for f in _FILTERS):
        return sorted(wanted.numbers)
    from qmailpy.ctl.queuewalk import records
    return sorted(r["n"] for r in records(home, wanted.numbers) if wanted(r))


def run(args):
    from qmailpy.home import qmail_home
    action = args.action
    if (action == "bounce") != (args.reason is not None):
        _say(action, "--reason TEXT is for bounce, and bounce needs it")
        return EXIT_USAGE
    if args.reason is not None:
        try:
            command.check_reason(args.reason)
        except command.CommandError as e:
            _say(action, str(e))
            return EXIT_USAGE
    wanted = queuefilter.from_args(args)
    if wanted.numbers is None and not any(getattr(wanted, f) is not None for f in _FILTERS):
        _say(action, "name the messages: NUMBER... or filters (see qmailctl(8))")
        return EXIT_USAGE
    home = qmail_home(args.home)
    try:
        return _send(action, home, wanted, args)
    except nofollow.Refused as e:
        _say(action, "%s; nothing more done" % e)
        return EXIT_TEMP


def _send(action, home, wanted, args):
    """Write the command, wait for the reply and report it. Everything under queue/
    is reached through descriptors (docs/security.md "The command channel")."""
    queue = os.path.join(home, "queue")
    cdir = os.path.join(queue, command.COMMAND_DIR)
    try:
        cfd = nofollow.open_path(home, os.path.join("queue", command.COMMAND_DIR))
    except FileNotFoundError:
        _say(action, "no %s (qmailctl init makes it); nothing done" % cdir)
        return EXIT_TEMP
    try:
        if not send_running(home):
            _say(action, "qmail-send is not running; nothing done")
            return EXIT_TEMP
        try:
            numbers = select_numbers(home, wanted)
        except (OSError, ValueError) as e:
            _say(action, "unable to read the queue: %s" % e)
            return EXIT_TEMP
        if not numbers:
            _say(action, "no message matches")
            return EXIT_NOT_DONE
        name = "%d-%d-%s" % (time.time_ns(), os.getpid(), os.urandom(4).hex())
        data = command.encode(command.Command(action, numbers, args.reason))
        from inotify_simple import INotify, flags
        with INotify() as ino:
            # the directory the descriptor holds, whatever its name points at by now
            ino.add_watch("/proc/self/fd/%d" % cfd, flags.MOVED_TO | flags.CREATE)
            command.write_atomically(cfd, name, data, 0o644)
            trigger.pull(queue)
            reply = _wait(ino, cfd, cdir, name, home, args.timeout, action)
    finally:
        os.close(cfd)
    if reply is None:
        return EXIT_TEMP
    status = 0
    with reply:
        for n, result, text in command.decode_reply(reply):
            if result == command.DONE:
                print("%d: %s" % (n, text))
            else:
                _say(action, "%d: %s" % (n, text))
                status = EXIT_TEMP if result == command.LATER or status == EXIT_TEMP else EXIT_NOT_DONE
    return status


def _wait(ino, cfd, cdir, name, home, timeout, action):
    """The reply, open (and already unlinked), or None (said why on stderr) when there is
    none to wait for. A reply that is not a regular file is nofollow.Refused."""
    reply = name + command.REPLY
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = nofollow.open_file(reply, cfd)
            os.unlink(reply, dir_fd=cfd)
            return os.fdopen(fd, "rb")
        except FileNotFoundError:
            pass
        left = deadline - time.monotonic()
        running = send_running(home)
        if left <= 0 or not running:
            try:
                os.unlink(name, dir_fd=cfd)         # withdrawn: it never started
                why = "did not take the command in %g s" % timeout if running else "is not running"
                _say(action, "qmail-send %s; nothing done" % why)
            except FileNotFoundError:
                if _exists(reply, cfd):
                    continue
                _say(action, "qmail-send %s: %s" % (
                    "is still carrying out the command (deliveries in flight); it finishes it"
                    if running else "stopped while carrying out the command; it finishes it "
                    "when it starts again", os.path.join(cdir, name + command.WORK)))
            return None
        # the second wake-up bounds a qmail-send that died without answering
        ino.read(timeout=int(min(left, 1.0) * 1000) + 1)


def _exists(name, dir_fd):
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
