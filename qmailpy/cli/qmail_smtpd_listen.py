"""qmail-smtpd-listen [-c limit] [-s perclient] [-n uses] [-i seconds] [-l localname] HOST:PORT:
a listener for qmail-smtpd whose session workers serve many connections each (at most
`uses`, and none after `seconds` idle).

Per-client rules (tcprules' source format) come from control/smtpclients. Run with
SMTPAUTH=! in its environment it is a submission port (STARTTLS, then AUTH before MAIL).
This module reads the arguments; qmailpy.smtpd.listensetup starts the listener.
"""
import sys

USAGE = ("qmail-smtpd-listen: usage: qmail-smtpd-listen [ -c limit ] [ -s perclient ]"
         " [ -n uses ] [ -i seconds ] [ -l localname ] host:port\n")


def _parse(argv):
    from qmailpy.util.sgetopt import GetoptError, sgetopt
    try:
        opts, args = sgetopt(argv, "c:s:n:i:l:")
    except GetoptError:
        return None
    from qmailpy.workerserver import DEFAULT_MAX_IDLE, DEFAULT_MAX_USE
    numbers = {"c": 40, "s": None, "n": DEFAULT_MAX_USE, "i": DEFAULT_MAX_IDLE}
    local = None
    for opt, value in opts:
        if opt in numbers:
            if not value.isascii() or not value.isdigit() or int(value) < 1:
                return None
            numbers[opt] = int(value)
        elif opt == "l":
            local = value
    if len(args) != 1:
        return None
    host, sep, port = args[0].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port), numbers, local


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parsed = _parse(argv)
    if parsed is None:
        sys.stderr.write(USAGE)
        return 100
    from qmailpy.smtpd import listensetup
    return listensetup.run(*parsed)


if __name__ == "__main__":
    sys.exit(main())
