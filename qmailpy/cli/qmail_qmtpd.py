"""qmail-qmtpd: one QMTP session on fds 0/1 with the tcpserver environment (qmail-qmtpd(8))."""
import os
import sys


def main(argv=None):
    from qmailpy.home import qmail_home
    home = qmail_home()
    try:
        from qmailpy.smtpd.privileges import enter
        enter(home)
    except Exception as e:
        from qmailpy import internalerror, privs     # a home it cannot enter, or a bug
        internalerror.log_if_bug("qmail-qmtpd", e, (OSError, privs.PrivError))
        return 111
    from qmailpy.smtpd.qmtp import serve
    from qmailpy.smtpd.tcpenv import complete
    return serve(home, complete(os.environ))


if __name__ == "__main__":
    sys.exit(main())
