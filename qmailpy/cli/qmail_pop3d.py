"""qmail-pop3d Maildir: the POP3 transaction state on a Maildir (qmail-pop3d(8))."""
import sys


def main(argv=None):
    from qmailpy.pop3.pop3d import main as pop3d
    argv = sys.argv[1:] if argv is None else argv
    return pop3d([arg.encode("utf-8", "surrogateescape") for arg in argv])


if __name__ == "__main__":
    sys.exit(main())
