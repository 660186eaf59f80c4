"""qmailctl queue list: the messages a filter selects, in qmail-qread's format or as
JSON lines (qmail-snapshot(5) message records), one message at a time.

Exit 0; 1 when a NUMBER given is not in the queue (each named on stderr, the others
still listed); 111 when the queue cannot be read.
"""
import sys

from qmailpy.ctl import queuefilter

HELP = "list queued messages (qmail-qread's format, or JSON lines with --json)"


def add_arguments(parser):
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per message, with every field of a snapshot record")
    queuefilter.add_arguments(parser)


def missing_numbers(wanted, seen):
    """Report each NUMBER asked for that was not found; the exit code for it."""
    if wanted.numbers is None:
        return 0
    gone = sorted(wanted.numbers - seen)
    for n in gone:
        print("qmailctl queue: no message #%d in the queue" % n, file=sys.stderr)
    return 1 if gone else 0


def run(args):
    from qmailpy.ctl.qread import record_lines
    from qmailpy.ctl.queuewalk import records
    from qmailpy.home import ControlError, qmail_home
    from qmailpy.snapshot_format import dumps
    wanted = queuefilter.from_args(args)
    out = sys.stdout.buffer
    seen = set()
    try:
        for record in records(qmail_home(args.home), wanted.numbers):
            if wanted.numbers is not None:
                seen.add(record["n"])        # at most the numbers given
            if not wanted(record):
                continue
            if args.json:
                out.write(dumps(record).encode("ascii") + b"\n")
            else:
                out.writelines(record_lines(record))
    except (OSError, ControlError, ValueError) as e:
        out.flush()
        print("qmailctl queue list: %s" % e, file=sys.stderr)
        return 111
    out.flush()
    return missing_numbers(wanted, seen)
