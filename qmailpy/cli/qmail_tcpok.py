"""qmail-tcpok: forget every connection timeout qmail-remote remembers (qmail-tcpok(8)).

Clears queue/lock/tcpto under its lock, as qmail's does, and qmailpy's
queue/lock/tcpto6 (IPv6 addresses) when it exists. Exit 0; 111 with
``qmail-tcpok: fatal: ...`` when a table cannot be opened, locked or cleared.
queue/lock and the tables are opened without following symlinks
(qmailpy.nofollow): root runs this where another account owns them.
"""
import os
import sys

FATAL = "qmail-tcpok: fatal: "
VERBS = {"open": "write", "lock": "lock", "clear": "clear"}


def main(argv=None):
    from qmailpy import nofollow
    from qmailpy.cli.qmail_tcpto import why
    from qmailpy.home import qmail_home
    from qmailpy.remote import tcpto
    home = qmail_home()
    try:
        lockdir = nofollow.open_path(home, os.path.join("queue", "lock"))
    except OSError as e:
        sys.stderr.write("%sunable to chdir to %s/queue/lock: %s\n" % (FATAL, home, why(e)))
        return 111
    try:
        for layout, optional in ((tcpto.IPV4, False), (tcpto.IPV6, True)):
            name = "tcpto" + layout.suffix
            try:
                tcpto.clear(name, lockdir, layout)
            except tcpto.AccessError as e:
                if optional and e.stage == "open" and isinstance(e.error, FileNotFoundError):
                    continue
                sys.stderr.write("%sunable to %s %s/queue/lock/%s: %s\n"
                                 % (FATAL, VERBS[e.stage], home, name, why(e.error)))
                return 111
    finally:
        os.close(lockdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
