"""qmail-start [defaultdelivery [logger args...]]: start qmail-send and its helpers (docs/protocols.md "qmail-start")."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from qmailpy.home import qmail_home
    from qmailpy.send.start import DEFAULT_DELIVERY, StartFailure, start
    defaultdelivery = argv[0] if argv else DEFAULT_DELIVERY
    try:
        start(qmail_home(), defaultdelivery, argv[1:])
    except StartFailure:
        return 111
    return 111


if __name__ == "__main__":
    sys.exit(main())
