"""qmail-rspawn: remote spawner between qmail-send and qmail-remote (docs/delivery.md "qmail-rspawn").

Commands on fd 0, replies on fd 1 (the spawn protocol, docs/protocols.md "qmail-send ↔ spawners").
"""
import sys


def main(argv=None):
    from qmailpy import internalerror
    from qmailpy.home import qmail_home
    from qmailpy.remote.rspawn import serve
    return internalerror.daemon("qmail-rspawn", lambda: serve(qmail_home()))


if __name__ == "__main__":
    sys.exit(main())
