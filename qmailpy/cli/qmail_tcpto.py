"""qmail-tcpto: list the addresses whose connections recently timed out (qmail-tcpto(8)).

One line per address with a count, as qmail's: ``IP timed out N seconds ago;
# recent timeouts: C``. IPv4 addresses come from queue/lock/tcpto; then
qmailpy's IPv6 addresses from queue/lock/tcpto6 (docs/delivery.md "`lock/tcpto`
format"), when that file exists. Failures are reported on stdout, as qmail
does, with exit 111.
"""
import os
import sys


def lines(records, now):
    import ipaddress
    return ["%s timed out %d seconds ago; # recent timeouts: %d\n"
            % (ipaddress.ip_address(ip), (now - when) & 0xFFFFFFFF, count) for ip, count, when in records]


def main(argv=None):
    import time
    from qmailpy.home import qmail_home
    from qmailpy.local.errors import error_str
    from qmailpy.remote import tcpto
    out = []

    def fail(what, error):
        out.append("fatal: unable to %s: %s\n" % (what, error_str(error).decode()))
        sys.stdout.write("".join(out))
        return 111
    lockdir = os.path.join(qmail_home(), "queue", "lock")
    try:
        os.close(os.open(lockdir, os.O_RDONLY | os.O_DIRECTORY))
    except OSError as e:
        return fail("chdir", e)
    path = os.path.join(lockdir, "tcpto")
    now = int(time.time())
    try:
        out.extend(lines(tcpto.listed(path, tcpto.IPV4), now))
    except tcpto.AccessError as e:
        return fail(e.stage + " tcpto", e.error)
    try:
        out.extend(lines(tcpto.listed(path + tcpto.IPV6.suffix, tcpto.IPV6), now))
    except tcpto.AccessError as e:
        if not (e.stage == "open" and isinstance(e.error, FileNotFoundError)):
            return fail(e.stage + " tcpto6", e.error)
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
