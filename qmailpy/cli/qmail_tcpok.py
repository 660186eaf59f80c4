"""qmail-tcpok: forget every connection timeout qmail-remote remembers (qmail-tcpok(8)).

Clears queue/lock/tcpto under its lock, as qmail's does, and qmailpy's
queue/lock/tcpto6 (IPv6 addresses) when it exists. Exit 0; 111 with
``qmail-tcpok: fatal: ...`` when a table cannot be opened, locked or cleared.
"""
import os
import sys

FATAL = "qmail-tcpok: fatal: "
VERBS = {"open": "write", "lock": "lock", "clear": "clear"}


def main(argv=None):
    from qmailpy.home import qmail_home
    from qmailpy.local.errors import error_str
    from qmailpy.remote import tcpto
    home = qmail_home()
    lockdir = os.path.join(home, "queue", "lock")
    try:
        os.close(os.open(lockdir, os.O_RDONLY | os.O_DIRECTORY))
    except OSError as e:
        sys.stderr.write("%sunable to chdir to %s/queue/lock: %s\n" % (FATAL, home, error_str(e).decode()))
        return 111
    for layout, optional in ((tcpto.IPV4, False), (tcpto.IPV6, True)):
        path = os.path.join(lockdir, "tcpto" + layout.suffix)
        try:
            tcpto.clear(path, layout)
        except tcpto.AccessError as e:
            if optional and e.stage == "open" and isinstance(e.error, FileNotFoundError):
                continue
            sys.stderr.write("%sunable to %s %s: %s\n"
                             % (FATAL, VERBS[e.stage], path, error_str(e.error).decode()))
            return 111
    return 0


if __name__ == "__main__":
    sys.exit(main())
