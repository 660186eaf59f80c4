"""bouncesaying error [program [arg ...]]: bounce the message with error, always or when
program exits 0 (docs/delivery.md "Delivery helpers"; bouncesaying(1)).

Without program: error on stderr, exit 100. With it: program reads the message;
exit 0 bounces as above, 111 (or a crash) is temporary (111), anything else, or
a program that cannot be run for a permanent reason, exits 0.
"""
import sys

from qmailpy.helpers.common import outcome, run_main
from qmailpy.local.errors import Failure

PROG = b"bouncesaying"
USAGE = b"bouncesaying: usage: bouncesaying error [ program [ arg ... ] ]"


def bouncesaying(args):
    if not args:
        raise Failure(100, USAGE)
    if len(args) > 1 and not outcome(PROG, args[1:]):
        return 0
    raise Failure(100, args[0])


def main(argv=None):
    return run_main(bouncesaying, argv)


if __name__ == "__main__":
    sys.exit(main())
