"""datemail [sendmail's arguments]: sendmail with a Date field in local time (datemail(8)).

As qmail's script: predate runs QMAILHOME/bin/sendmail with the arguments."""
import os
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from qmailpy.cli.predate import run
    from qmailpy.home import BIN, qmail_home
    return run([os.path.join(qmail_home(), BIN, "sendmail")] + list(argv))


if __name__ == "__main__":
    sys.exit(main())
