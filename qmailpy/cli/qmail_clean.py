"""qmail-clean: unlink queue files on qmail-send's behalf (docs/protocols.md "qmail-send ↔ qmail-clean")."""
import os
import signal
import sys


def main(argv=None):
    from qmailpy.home import qmail_home
    from qmailpy.send.clean import serve
    try:
        os.chdir(qmail_home())
        os.chdir("queue")
    except OSError:
        return 111
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    from qmailpy import internalerror
    return internalerror.daemon("qmail-clean", lambda: serve(0, 1))


if __name__ == "__main__":
    sys.exit(main())
