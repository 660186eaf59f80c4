"""spark-submit entry: `spark-submit spark/submit.py [qmail-audit options] INPUT...`."""
import sys

from qmailpy.cli.qmail_audit import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], use_existing_master=True))
