"""forward address [address ...]: queue the message on stdin, DTLINE first, to the
addresses, from $NEWSENDER (docs/delivery.md "Delivery helpers"; forward(1)).

Prints `forward: qp N` and exits 0; a queue failure exits 100 (permanent) or 111
with qmail-queue's text. Without an address: usage, 100 (qmail's forward would
queue a message for nobody).
"""
import sys

from qmailpy.helpers.common import requeue, run_main, say
from qmailpy.local.errors import Failure

PROG = b"forward"
USAGE = b"forward: usage: forward address [ address ... ]"


def forward(args):
    if not args:
        raise Failure(100, USAGE)
    qp = requeue(PROG, b"NEWSENDER", args)
    say(PROG + b": qp %d" % qp)
    return 0


def main(argv=None):
    return run_main(forward, argv)


if __name__ == "__main__":
    sys.exit(main())
