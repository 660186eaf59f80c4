"""mailsubj subject recipient ...: send stdin as a message with that subject (mailsubj(1)).

As qmail's script: ``Subject: subject``, ``To: recipient ...`` (the recipients
joined by spaces), an empty line and stdin, handed to QMAILHOME/bin/qmail-inject
with the recipients as arguments; its exit code is mailsubj's. Beyond the
script: without a subject and a recipient, a usage message and exit 100.
"""
import os
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        sys.stderr.write("mailsubj: usage: mailsubj subject recipient ...\n")
        return 100
    from qmailpy.cli.predate import feed
    from qmailpy.home import BIN, qmail_home
    subject, recipients = argv[0], argv[1:]
    head = b"Subject: " + os.fsencode(subject) + b"\nTo: " + b" ".join(map(os.fsencode, recipients)) + b"\n\n"
    return feed([os.path.join(qmail_home(), BIN, "qmail-inject")] + recipients, lambda: head,
                "mailsubj: fatal: ")


if __name__ == "__main__":
    sys.exit(main())
