"""qmail-popup HOST subprogram...: POP3 authorization, then checkpassword (qmail-popup(8))."""
import os
import sys


def main(argv=None):
    from qmailpy.pop3.popup import main as popup
    argv = sys.argv[1:] if argv is None else argv
    from qmailpy.smtpd.tcpenv import complete
    return popup(argv, complete(os.environ))


if __name__ == "__main__":
    sys.exit(main())
