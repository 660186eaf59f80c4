"""qmailctl queue size (and qmail-qstat): messages in the queue per state.

States as queuefilter.py names them; total = new + preprocessed (messages with an
envelope: a body still being written is not counted). local and remote count the
messages whose channel is still open, held those kept back by `queue hold`.

Directory backend: a count of the directory entries (todo/, info/*, local/*,
remote/*, hold/). Log backend: qmail-send's counters (backends/log/counts.py) plus
the records appended since it last wrote them, so near O(1); --exact reads every
message instead (memory bounded, time proportional to the queue).
Exit 0; 111 when the queue cannot be read.
"""
import json
import os
import sys

HELP = "count the queued messages per state (new, preprocessed, local, remote, held, total)"
ORDER = ("total", "new", "preprocessed", "local", "remote", "held")


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--exact", action="store_true",
                        help="log backend: count by reading every message, not the counters")


def exact_sizes(home):
    """Every message read once (either backend), memory bounded."""
    from qmailpy.ctl.queuefilter import record_states
    from qmailpy.ctl.queuewalk import records
    sizes = dict.fromkeys(ORDER, 0)
    for record in records(home):
        for name in record_states(record):
            sizes[name] += 1
        sizes["total"] += 1
    return sizes


def sizes(home, exact=False):
    """{state: count} of a home's queue, as described above."""
    from qmailpy.backends import backend_name
    if backend_name(home) == "dir":
        from qmailpy.backends.dir.listing import state_counts
        return state_counts(os.path.join(home, "queue"))
    if not exact:
        from qmailpy.backends.log.queue import LogQueue
        queue = LogQueue(home)
        try:
            counts = queue.current_counts()
        finally:
            queue.close()
        if counts is not None:
            return counts.as_dict()
    return exact_sizes(home)


def run(args):
    from qmailpy.home import ControlError, qmail_home
    try:
        found = sizes(qmail_home(args.home), args.exact)
    except (OSError, ControlError, ValueError) as e:
        print("qmailctl queue size: %s" % e, file=sys.stderr)
        return 111
    if args.json:
        print(json.dumps({k: found[k] for k in ORDER}))
    else:
        for k in ORDER:
            print("%s: %d" % (k, found[k]))
    return 0
