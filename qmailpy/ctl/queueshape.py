"""qmailctl queue shape: Postfix qshape's table of the pending deliveries.

One row per recipient domain, one column per age bucket: T (the row's total), then
messages up to 5, 10, 20, 40, 80, 160, 320, 640, 1280 minutes old and older
(1280+). Each pending recipient (not yet done) counts once in its domain's row, by
its message's age. TOTAL first, then the domains by total, largest first (ties by
name); -n N keeps the top N. The filters of `queue list` choose the messages.
Exit 0; 111 when the queue cannot be read.
"""
import sys
import time

from qmailpy.ctl import queuefilter

HELP = "a table of pending deliveries: recipient domains by age (as Postfix's qshape)"
BUCKETS = (5, 10, 20, 40, 80, 160, 320, 640, 1280)
HEADINGS = ["T"] + [str(b) for b in BUCKETS] + ["%d+" % BUCKETS[-1]]


def add_arguments(parser):
    parser.add_argument("-n", type=int, metavar="N", dest="top",
                        help="show only the N domains with most pending deliveries")
    queuefilter.add_arguments(parser)


def bucket(age_seconds):
    """Index of an age's column among the buckets (0 = up to 5 minutes)."""
    minutes = age_seconds / 60
    for i, limit in enumerate(BUCKETS):
        if minutes <= limit:
            return i
    return len(BUCKETS)


def shape(records, now):
    """{domain: [counts per bucket]} of the pending recipients of records."""
    table = {}
    for record in records:
        i = bucket(max(0, now - (record["birth"] or now)))
        for r in queuefilter.pending(record):
            row = table.setdefault(queuefilter.domain_of(r["address"]), [0] * (len(BUCKETS) + 1))
            row[i] += 1
    return table


def render(table, top=None):
    rows = sorted(table.items(), key=lambda item: (-sum(item[1]), item[0]))
    if top is not None:
        rows = rows[:top]
    total = [sum(col) for col in zip(*table.values())] if table else [0] * (len(BUCKETS) + 1)
    lines = [("", HEADINGS), ("TOTAL", [sum(total)] + total)]
    lines += [(domain or "(no domain)", [sum(counts)] + counts) for domain, counts in rows]
    widths = [max(len(str(cells[i])) for _, cells in lines) for i in range(len(HEADINGS))]
    name_width = max(len(name) for name, _ in lines)
    return "".join("%s %s\n" % (name.rjust(name_width),
                                " ".join(str(c).rjust(w) for c, w in zip(cells, widths)))
                   for name, cells in lines)


def run(args):
    from qmailpy.ctl.queuewalk import records
    from qmailpy.home import ControlError, qmail_home
    now = time.time()
    wanted = queuefilter.from_args(args, now=now)
    try:
        table = shape((r for r in records(qmail_home(args.home), wanted.numbers) if wanted(r)), now)
    except (OSError, ControlError, ValueError) as e:
        print("qmailctl queue shape: %s" % e, file=sys.stderr)
        return 111
    sys.stdout.write(render(table, args.top))
    return 0
