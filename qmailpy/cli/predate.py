"""predate child [arg ...]: run child with a Date field in local time before the message (predate(8)).

As qmail's: child's stdin is a pipe carrying ``Date: D Mon YYYY HH:MM:SS +HHMM``
(the local time and its offset from UTC, rounded to the minute) and then
predate's own stdin; predate exits with child's exit code. Exit 100 without a
child; 111 when it cannot be run (``predate: fatal: unable to run ...``) or
is killed by a signal (``predate: fatal: child crashed``).
"""
import os
import sys

FATAL = "predate: fatal: "
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def date_field(now):
    """The Date line for the time `now`, in the local time zone."""
    import calendar
    import time
    utc = calendar.timegm(time.gmtime(now))
    t = time.localtime(now)
    local = calendar.timegm(t)
    sign, minutes = ("-", (utc - local + 30) // 60) if local < utc else ("+", (local - utc + 30) // 60)
    return b"Date: %d %s %d %02d:%02d:%02d %s%02d%02d\n" % (
        t.tm_mday, MONTHS[t.tm_mon - 1].encode(), t.tm_year, t.tm_hour, t.tm_min, t.tm_sec,
        sign.encode(), minutes // 60, minutes % 60)


def run(child):
    """Run child (argv) as predate does; its exit code."""
    import time
    return feed(child, lambda: date_field(time.time()), FATAL)


def feed(child, head, fatal):
    """Run child with head() and then our stdin on its stdin; its exit code, or 111 with
    `fatal` + the reason when it cannot be run or is killed by a signal."""
    import signal
    import subprocess
    from qmailpy.local.errors import error_str
    try:
        proc = subprocess.Popen(child, stdin=subprocess.PIPE)
    except OSError as e:
        sys.stderr.write("%sunable to run %s: %s\n" % (fatal, child[0], error_str(e).decode()))
        return 111
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    pipe = proc.stdin.fileno()
    try:
        data = head()
        while data:
            view = memoryview(data)
            while view:
                view = view[os.write(pipe, view):]
            data = os.read(0, 65536)
    except OSError:
        pass                        # the child stopped reading: its exit code tells
    proc.stdin.close()
    code = proc.wait()
    if code < 0:
        sys.stderr.write(fatal + "child crashed\n")
        return 111
    return code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("predate: usage: predate child\n")
        return 100
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
