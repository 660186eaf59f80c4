"""qmail-lspawn defaultdelivery

Argument parsing only; the spawner is qmailpy.local.lspawn. The home is $QMAILHOME
(default /var/qmail). Without defaultdelivery: exit 100, as qmail does.
"""
import os
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return 100
    from qmailpy import internalerror
    from qmailpy.local import lspawn
    from qmailpy.home import qmail_home
    return internalerror.daemon("qmail-lspawn",
                                lambda: lspawn.run(qmail_home(), os.fsencode(argv[0])))


if __name__ == "__main__":
    sys.exit(main())
