"""maildirmake dir: make a Maildir, dir with tmp, new and cur, each mode 0700
(docs/delivery.md "Delivery helpers"; maildirmake(1)).

dir must not exist yet. Failures: 111 with qmail's wording; no argument: 100.
"""
import os
import sys

from qmailpy.helpers.common import fatal, run_main
from qmailpy.local.errors import Failure, error_str

PROG = b"maildirmake"
USAGE = b"maildirmake: usage: maildirmake name"


def _mkdir(path, shown):
    try:
        os.mkdir(path, 0o700)
    except OSError as e:
        raise Failure(111, fatal(PROG, b"unable to mkdir ", shown, b": ", error_str(e))) from e


def maildirmake(args):
    if not args:
        raise Failure(100, USAGE)
    name = args[0]
    os.umask(0o077)
    _mkdir(name, name)
    try:
        os.chdir(name)
    except OSError as e:
        raise Failure(111, fatal(PROG, b"unable to chdir to ", name, b": ", error_str(e))) from e
    for sub in (b"tmp", b"new", b"cur"):
        _mkdir(sub, name + b"/" + sub)
    return 0


def main(argv=None):
    return run_main(maildirmake, argv)


if __name__ == "__main__":
    sys.exit(main())
