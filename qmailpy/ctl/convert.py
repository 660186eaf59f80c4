"""qmailctl convert --to log|dir: move a stopped queue to the other backend.

Exit 0 converted (or already that backend), 1 refused or failed (the source is
left intact), 2 usage. Progress goes to stderr.
"""
import errno
import fcntl
import os
import sys

HELP = "move a stopped queue between the directory and the log backend"


def add_arguments(parser, name):
    parser.add_argument("--to", required=True, choices=("log", "dir"), help="the backend to convert to")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _set_backend(home, name):
    path = os.path.join(home, "control", "queuebackend")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    st = os.stat(os.path.join(home, "control"))
    os.chmod(tmp, 0o644)
    if os.geteuid() == 0:
        os.chown(tmp, st.st_uid, st.st_gid)
    os.rename(tmp, path)


def run(args):
    from qmailpy.backends import backend_name
    from qmailpy.backends.logconvert import ConvertError, dir_to_log, log_to_dir
    from qmailpy.home import qmail_home
    home = qmail_home(args.home)
    try:
        current = backend_name(home)
    except (ValueError, OSError) as e:
        print("qmailctl convert: %s" % e, file=sys.stderr)
        return 1
    mutex = os.path.join(home, "queue", "lock", "sendmutex")
    try:
        fd = os.open(mutex, os.O_WRONLY)
    except OSError as e:
        print("qmailctl convert: unable to open %s: %s" % (mutex, e.strerror), file=sys.stderr)
        return 1
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                print("qmailctl convert: qmail-send is running; stop it first", file=sys.stderr)
                return 1
            raise
        if current == args.to:
            print("qmailctl convert: the queue already uses the %s backend" % current, file=sys.stderr)
            return 0
        progress = None if args.quiet else sys.stderr
        try:
            count = dir_to_log(home, progress) if args.to == "log" else log_to_dir(home, progress)
        except (ConvertError, OSError) as e:
            print("qmailctl convert: %s" % e, file=sys.stderr)
            return 1
        _set_backend(home, args.to)
        print("qmailctl convert: %d messages moved to the %s backend, verified" % (count, args.to),
              file=sys.stderr)
        return 0
    finally:
        os.close(fd)
