"""qmailctl snapshot: write one queue snapshot (qmail-snapshot(5)) of a home.

No Spark here: this runs on every mail host from qmail-audit.timer.
"""
import os
import sys

from qmailpy import snapshot_format as snapshot
from qmailpy.home import ControlError, qmail_home

HELP = "write a snapshot of the queue (one JSON line per message) for qmail-audit"


def add_arguments(parser, name):
    parser.add_argument("--out", metavar="FILE",
                        help="write the snapshot to FILE (atomically) instead of stdout")
    parser.add_argument("--host", metavar="NAME",
                        help="host name recorded in the snapshot (default: this host's name)")
    parser.add_argument("--from-notqmail", metavar="DUMP",
                        help="convert a notqmail queue text dump instead of walking a home")


def _records(args):
    if args.from_notqmail:
        with open(args.from_notqmail, encoding="utf-8", errors="surrogateescape") as f:
            return list(snapshot.from_notqmail_text(f, args.host or "notqmail"))
    home = qmail_home(args.home)
    if not os.path.isdir(os.path.join(home, "queue")):
        raise OSError("%s has no queue directory" % home)
    from qmailpy.backends import snapshot as home_snapshot
    return home_snapshot.walk(home, host=args.host)


def run(args):
    try:
        records = _records(args)
        if not args.out:
            snapshot.write(records, sys.stdout)
            sys.stdout.flush()
            return 0
        tmp = "%s.tmp.%d" % (args.out, os.getpid())
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                snapshot.write(records, f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, args.out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return 0
    except (OSError, ControlError, ValueError) as e:
        print("qmailctl snapshot: %s" % e, file=sys.stderr)
        return 111
