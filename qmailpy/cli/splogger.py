"""splogger [tag [fac]]: send each line of stdin to syslog (splogger(8)).

As qmail's: openlog(tag, 0, fac << 3) (default tag "splogger", facility
LOG_MAIL); each line goes out as ``SECONDS.MICROSECONDS text`` at LOG_ALERT when
it starts with "alert:", LOG_WARNING with "warning:", else LOG_INFO; bytes
outside 32..126 become '?'; a line longer than 799 bytes is cut into pieces,
each later piece as ``SECONDS.MICROSECONDS+text`` with the first piece's stamp
and priority. Beyond qmail, a last line without a newline is logged too
(qmail's drops it). Exit 0 at the end of the input.
"""
import os
import sys

PIECE = 799         # qmail's buffer: syslog truncates long lines


def priority_of(line):
    import syslog
    if line.startswith(b"alert:"):
        return syslog.LOG_ALERT
    if line.startswith(b"warning:"):
        return syslog.LOG_WARNING
    return syslog.LOG_INFO


def stamp():
    import time
    now = time.time_ns() // 1000
    return "%d.%06d" % (now // 1000000, now % 1000000)


def log_line(line):
    import syslog
    clean = bytes(c if 32 <= c <= 126 else 63 for c in line).decode("ascii")
    first, rest = clean[:PIECE], clean[PIECE:]
    when, priority = stamp(), priority_of(line)
    syslog.syslog(priority, "%s %s" % (when, first))
    while rest:
        syslog.syslog(priority, "%s+%s" % (when, rest[:PIECE]))
        rest = rest[PIECE:]


def main(argv=None):
    import syslog
    argv = sys.argv[1:] if argv is None else argv
    tag = argv[0] if argv else "splogger"
    facility = syslog.LOG_MAIL
    if len(argv) > 1:
        digits = len(argv[1]) - len(argv[1].lstrip("0123456789"))
        facility = (int(argv[1][:digits]) if digits else 0) << 3
    syslog.openlog(tag, 0, facility)
    pending = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                log_line(pending)
            return 0
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line:
                log_line(line)


if __name__ == "__main__":
    sys.exit(main())
