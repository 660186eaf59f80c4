"""qmailctl convert --to log|dir: move a stopped queue to the other backend.

Exit 0 converted (or already that backend), 1 refused or failed (the source is
left intact), 2 usage. Progress goes to stderr. qmail-send must be stopped
(lock/sendmutex); qmail-queue is held off for the whole run by an exclusive
flock on queue/ (qmail-queue takes it shared).

Crash-safe order: queue/lock/convert (the target's name) is written first; then
the target, durable and verified; then control/queuebackend is switched
atomically; then the source is removed; then the marker. A re-run that finds the
marker either finishes removing the source (the switch happened) or discards the
half-written target (it did not) before doing what it was asked.
QMAILPY_CONVERT_CRASH_AT=step makes the process SIGKILL itself at that step (tests).
"""
import errno
import fcntl
import os
import signal
import sys

from qmailpy.fileio import fsync_dir

HELP = "move a stopped queue between the directory and the log backend"


def add_arguments(parser, name):
    parser.add_argument("--to", required=True, choices=("log", "dir"), help="the backend to convert to")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _write_durably(path, text):
    """path holds text whole (a fresh .tmp, synced, renamed), owned like its directory
    when run as root. Through the directory's descriptor (qmailpy.nofollow):
    queue/lock/ is qmailq's and a single-user home's control/ its user's, and a symlink
    planted at NAME.tmp had root write through it, chmod it 0644 and chown it to them."""
    from qmailpy import nofollow
    directory, name = os.path.split(path)
    parent, base = os.path.split(os.path.abspath(directory))
    dfd = nofollow.open_path(parent, base)
    try:
        st = os.fstat(dfd)
        nofollow.replace(dfd, name, text.encode(), 0o644,
                         (st.st_uid, st.st_gid) if os.geteuid() == 0 else None, sync=True)
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _set_backend(home, name):
    control = os.path.join(home, "control")
    _write_durably(os.path.join(control, "queuebackend"), name + "\n")


def _marker(home):
    return os.path.join(home, "queue", "lock", "convert")


def _read_marker(home):
    from qmailpy import nofollow
    try:
        lock = nofollow.open_path(home, os.path.join("queue", "lock"))
        try:
            fd = nofollow.open_file(os.path.basename(_marker(home)), lock)
        finally:
            os.close(lock)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        name = f.read().strip()
    return name if name in ("log", "dir") else None


def _clear_marker(home):
    try:
        os.unlink(_marker(home))
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(_marker(home)))


def _crash_step():
    at = os.environ.get("QMAILPY_CONVERT_CRASH_AT")

    def step(name):
        if name == at:
            os.kill(os.getpid(), signal.SIGKILL)
    return step


def _resume(home, current, step):
    """Finish or undo a conversion a crash interrupted (see the module's docstring)."""
    from qmailpy.backends.convert import remove_dir, remove_log
    marked = _read_marker(home)
    if marked is None:
        return
    queue = os.path.join(home, "queue")
    remove = {"log": remove_log, "dir": remove_dir}
    if marked == current:
        print("qmailctl convert: finishing an interrupted conversion to the %s backend" % marked,
              file=sys.stderr)
        remove["dir" if marked == "log" else "log"](queue, step)
    else:
        print("qmailctl convert: discarding an interrupted conversion to the %s backend" % marked,
              file=sys.stderr)
        remove[marked](queue, step)
    _clear_marker(home)


def _convert(home, to, progress, step):
    from qmailpy.backends.convert import ConvertError, dir_to_log, log_to_dir, remove_dir, remove_log
    queue = os.path.join(home, "queue")
    _write_durably(_marker(home), to + "\n")
    step("marker")
    try:
        count = dir_to_log(home, progress, step) if to == "log" else log_to_dir(home, progress, step)
    except ConvertError:
        (remove_log if to == "log" else remove_dir)(queue)
        _clear_marker(home)
        raise
    step("target")
    _set_backend(home, to)
    step("switched")
    (remove_dir if to == "log" else remove_log)(queue, step)
    _clear_marker(home)
    return count


def _hold_queue(home):
    """Keep qmail-queue out until exit: it holds a shared flock on queue/ while it
    queues a message and reads control/queuebackend only once it has the lock."""
    try:
        fd = os.open(os.path.join(home, "queue"), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        print("qmailctl convert: unable to open the queue: %s" % e.strerror, file=sys.stderr)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("qmailctl convert: waiting for running qmail-queue processes to finish",
              file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return True                       # fd stays open: the lock lasts until exit


def run(args):
    from qmailpy.backends import backend_name
    from qmailpy.backends.convert import ConvertError
    from qmailpy.home import qmail_home
    home = qmail_home(args.home)
    try:
        current = backend_name(home)
    except (ValueError, OSError) as e:
        print("qmailctl convert: %s" % e, file=sys.stderr)
        return 1
    mutex = os.path.join(home, "queue", "lock", "sendmutex")
    from qmailpy import nofollow
    try:
        # lock/ is qmailq's: a FIFO there held root's open for writing until a reader came
        lock = nofollow.open_path(home, os.path.join("queue", "lock"))
        try:
            fd = nofollow.open_file("sendmutex", lock, os.O_WRONLY)
        finally:
            os.close(lock)
    except OSError as e:
        print("qmailctl convert: unable to open %s: %s" % (mutex, e.strerror or e), file=sys.stderr)
        return 1
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                print("qmailctl convert: qmail-send is running; stop it first", file=sys.stderr)
                return 1
            raise
        if not _hold_queue(home):
            return 1
        step = _crash_step()
        progress = None if args.quiet else sys.stderr
        try:
            _resume(home, current, step)
            if current == args.to:
                print("qmailctl convert: the queue already uses the %s backend" % current, file=sys.stderr)
                return 0
            count = _convert(home, args.to, progress, step)
        except (ConvertError, OSError) as e:
            print("qmailctl convert: %s" % e, file=sys.stderr)
            return 1
        print("qmailctl convert: %d messages moved to the %s backend, verified" % (count, args.to),
              file=sys.stderr)
        return 0
    finally:
        os.close(fd)
