"""qmail-rspawn: remote spawner between qmail-send and qmail-remote (spec §9.1).

Commands on fd 0, replies on fd 1 (the spawn protocol, spec §7.2).
"""
import sys


def main(argv=None):
    from qmailpy.home import qmail_home
    from qmailpy.remote.rspawn import serve
    return serve(qmail_home())


if __name__ == "__main__":
    sys.exit(main())
