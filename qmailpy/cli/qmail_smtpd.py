"""qmail-smtpd: one SMTP session on fds 0/1 with the tcpserver environment (docs/submission.md "qmail-smtpd")."""
import os
import sys


def main(argv=None):
    from qmailpy.home import qmail_home
    from qmailpy.smtpd.session import R_CONTROLS, serve
    home = qmail_home()
    try:
        from qmailpy.smtpd.privileges import enter
        enter(home)
    except Exception as e:
        from qmailpy import internalerror, privs     # a home it cannot enter, or a bug
        internalerror.log_if_bug("qmail-smtpd", e, (OSError, privs.PrivError))
        try:
            os.write(1, R_CONTROLS)
        except OSError:
            pass
        return 1
    from qmailpy.smtpd.tcpenv import complete
    # in os.environ itself, so that a QMAILQUEUE program sees them as under tcpserver
    return serve(home, complete(os.environ))


if __name__ == "__main__":
    sys.exit(main())
