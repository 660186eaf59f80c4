"""qmail-getpw local: which account receives mail for a local part, from the passwd database (qmail-getpw(8)).

Prints qmail-lspawn's six fields, each ended by a NUL: user, uid, gid, home
directory, dash, extension. The rules are qmail's (qmailpy.local.users: the
longest prefix of local before a '-' that names an account, lowercased,
shorter than 32 bytes, not uid 0, owning its existing home directory; else
the alias user with dash '-' and local as extension; its home is
QMAILHOME/alias). Exit 0; 100 without an argument; 111 when the output cannot
be written; 115 when a home directory cannot be checked for a temporary
reason; 116 when there is no alias user.
"""
import os
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return 100
    from qmailpy.home import qmail_home
    from qmailpy.local.users import LookupFailure, getpw
    try:
        r = getpw(qmail_home(), os.fsencode(argv[0]))
    except LookupFailure as e:
        return e.code
    out = b"".join(field + b"\0" for field in (r.user, b"%d" % r.uid, b"%d" % r.gid, r.home, r.dash, r.ext))
    try:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    except OSError:
        return 111
    return 0


if __name__ == "__main__":
    sys.exit(main())
