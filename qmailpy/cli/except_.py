"""except program [arg ...]: run program and turn its success into a bounce
(docs/delivery.md "Delivery helpers"; except(1)).

program exits 0: exit 100. 111 (or a crash): 111. Anything else, or a program
that cannot be run for a permanent reason: 0. (A module name cannot be `except`.)
"""
import sys

from qmailpy.helpers.common import outcome, run_main
from qmailpy.local.errors import Failure

PROG = b"except"
USAGE = b"except: usage: except program [ arg ... ]"


def except_(args):
    if not args:
        raise Failure(100, USAGE)
    return 100 if outcome(PROG, args) else 0


def main(argv=None):
    return run_main(except_, argv)


if __name__ == "__main__":
    sys.exit(main())
