"""qmail-tcpto: list the addresses whose connections recently timed out (qmail-tcpto(8)).

One line per address with a count, as qmail's: ``IP timed out N seconds ago;
# recent timeouts: C``. IPv4 addresses come from queue/lock/tcpto; then
qmailpy's IPv6 addresses from queue/lock/tcpto6 (docs/delivery.md "`lock/tcpto`
format"), when that file exists. Failures are reported on stdout, as qmail
does, with exit 111. queue/lock and the tables are opened without following
symlinks (qmailpy.nofollow): root may run this where another account owns them.
"""
import os
import sys


def lines(records, now):
    import ipaddress
    return ["%s timed out %d seconds ago; # recent timeouts: %d\n"
            % (ipaddress.ip_address(ip), (now - when) & 0xFFFFFFFF, count) for ip, count, when in records]


def why(error):
    """The reason to print for an OSError: qmail's text for its errno, or what nofollow refused
    (shared by qmail-tcpok and qmail-newmrh)."""
    from qmailpy import nofollow
    from qmailpy.local.errors import error_str
    return str(error) if isinstance(error, nofollow.Refused) else error_str(error).decode()


def main(argv=None):
    import time
    from qmailpy import nofollow
    from qmailpy.home import qmail_home
    from qmailpy.remote import tcpto
    out = []

    def fail(what, error):
        out.append("fatal: unable to %s: %s\n" % (what, why(error)))
        sys.stdout.write("".join(out))
        return 111
    try:
        lockdir = nofollow.open_path(qmail_home(), os.path.join("queue", "lock"))
    except OSError as e:
        return fail("chdir", e)
    now = int(time.time())
    try:
        try:
            out.extend(lines(tcpto.listed("tcpto", lockdir, tcpto.IPV4), now))
        except tcpto.AccessError as e:
            return fail(e.stage + " tcpto", e.error)
        try:
            out.extend(lines(tcpto.listed("tcpto" + tcpto.IPV6.suffix, lockdir, tcpto.IPV6), now))
        except tcpto.AccessError as e:
            if not (e.stage == "open" and isinstance(e.error, FileNotFoundError)):
                return fail(e.stage + " tcpto6", e.error)
    finally:
        os.close(lockdir)
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
