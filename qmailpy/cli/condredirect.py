"""condredirect newaddress program [arg ...]: if program exits 0, forward the message to
newaddress and exit 99 (docs/delivery.md "Delivery helpers"; condredirect(1)).

program reads the message on stdin; then stdin is rewound and DTLINE plus the
message are queued from $SENDER (as qmail's condredirect does; forward uses
$NEWSENDER). program exiting 111 (or crashing): 111; any other code, or a
program that cannot be run for a permanent reason: 0, the .qmail goes on.
"""
import os
import sys

from qmailpy.helpers.common import fatal, outcome, requeue, run_main, say
from qmailpy.local.errors import Failure, error_str

PROG = b"condredirect"
USAGE = b"condredirect: usage: condredirect newaddress program [ arg ... ]"


def condredirect(args):
    if len(args) < 2:
        raise Failure(100, USAGE)
    if not outcome(PROG, args[1:]):
        return 0
    try:
        os.lseek(0, 0, os.SEEK_SET)
    except OSError as e:
        raise Failure(111, fatal(PROG, b"unable to rewind: ", error_str(e))) from e
    qp = requeue(PROG, b"SENDER", [args[0]])
    say(PROG + b": qp %d" % qp)
    return 99


def main(argv=None):
    return run_main(condredirect, argv)


if __name__ == "__main__":
    sys.exit(main())
