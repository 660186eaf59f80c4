"""qmail-remote host sender recip...: send the message on fd 0 by SMTP (docs/delivery.md "qmail-remote").

Reports on stdout as records (letter, text, NUL) and always exits 0.
"""
import os
import sys


def main(argv=None):
    from qmailpy.home import qmail_home
    from qmailpy.remote.deliver import run
    argv = sys.argv[1:] if argv is None else argv
    args = [a if isinstance(a, bytes) else os.fsencode(a) for a in argv]
    return run(args, os.path.abspath(qmail_home()))


if __name__ == "__main__":
    sys.exit(main())
