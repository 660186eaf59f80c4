"""The log writer behind `qmailctl start`: stamps each line and rotates by size.

It reads a daemon's output on fd 0 and appends each line, prefixed with an
ISO-8601 UTC timestamp, to HOME/log/NAME.log (mode 0640: the log holds every
envelope address). Like multilog, it never lets the log grow without bound:
when the next lines would take the current file past control/logsize bytes, it
fsyncs the file, renames it to NAME.@STAMP.log (STAMP the UTC time of the
rotation, so names sort oldest first and before the current NAME.log) and
starts a new one, keeping the newest control/logcount rotated files and
deleting older ones. Lines are never split across files. Given the control
directory, it reads logsize and logcount again whenever either file changes, so
a new limit counts without a restart.

Like multilog, it never drops a line either: when the file system is full (or a
write fails otherwise) it pauses and tries again every PAUSE seconds. Meanwhile
the pipe fills and the daemon waits on its next log line: qmail-send stops
rather than deliver mail its log would not record.
"""
import fcntl
import os
import time

from qmailpy import nofollow
from qmailpy.logfiles import LOG_DIR, log_names, rotated_name, stamp_time

LOG_MODE = 0o640
PAUSE = 1               # seconds between attempts while writing fails (multilog's pause)
SIZE_CONTROL = "logsize"
COUNT_CONTROL = "logcount"
DEFAULT_SIZE = 10 * 1024 * 1024
DEFAULT_COUNT = 10
MIN_SIZE = 4096


def iso_now(t=None):
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)


def read_number(name, dir_fd, default, minimum):
    """Control file name in dir_fd by qmail's integer rule (qmailpy.home.readint), at
    least minimum; default when absent, unreadable, not a regular file (nofollow.open_file:
    no FIFO waited on), without leading digits, or 0."""
    from qmailpy.home import first_line, readint
    try:
        fd = nofollow.open_file(name, dir_fd)
    except OSError:
        return default
    try:
        with os.fdopen(fd, "rb") as f:
            value = readint(first_line(f.read(64)), 0)
    except OSError:
        return default
    return max(value, minimum) if value > 0 else default


def limits(home):
    """(size, count) from HOME/control/logsize and HOME/control/logcount, read through
    control/'s descriptor: qmailctl start reads them as root, and a single-user home's
    control/ is its user's, who could put a FIFO (root waited for ever) or a symlink there."""
    try:
        dfd = nofollow.open_path(home, "control")
    except OSError:
        return DEFAULT_SIZE, DEFAULT_COUNT
    try:
        return (read_number(SIZE_CONTROL, dfd, DEFAULT_SIZE, MIN_SIZE),
                read_number(COUNT_CONTROL, dfd, DEFAULT_COUNT, 1))
    finally:
        os.close(dfd)


def persist(operation):
    """operation(), tried again every PAUSE seconds until it does not fail."""
    while True:
        try:
            return operation()
        except OSError:
            time.sleep(PAUSE)


class RotatingLog:
    """The log file and its rotations, all reached through the log directory's
    descriptor: `qmailctl start` runs the writer as root, and in a single-user home
    the directory above log/ is the user's (docs/security.md "Root and other accounts'
    directories"). A symlink, FIFO or linked file in the log's place is refused
    (qmailpy.nofollow) and, like a full disk, tried again every PAUSE seconds; with
    wait=False an open that fails raises instead (qmailctl's own lines, append()).

    More than one writer may append to one log: a supervised writer and qmailctl's
    `delete` while qmail-send is down (queueoffline.py). Each holds an exclusive
    flock on the log directory while it appends and rotates, and then first takes up
    the file as the others left it (rotated: the new NAME.log; its length)."""

    def __init__(self, path, size=DEFAULT_SIZE, count=DEFAULT_COUNT, wait=True):
        self.path, self.size, self.count = path, size, count
        self._try = persist if wait else (lambda operation: operation())
        self.logdir, self.name = os.path.split(path)
        parent, base = os.path.split(os.path.abspath(self.logdir))
        self.dfd = self._try(lambda: nofollow.open_path(parent, base))
        try:
            self._open()
        except BaseException:
            os.close(self.dfd)
            raise

    def _open(self):
        self.fd = self._try(lambda: nofollow.open_file(self.name, self.dfd,
                                                       os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode=LOG_MODE))
        st = os.fstat(self.fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o777 != LOG_MODE:
            os.fchmod(self.fd, LOG_MODE)     # an older, world-readable log
        self.length = st.st_size

    def write_lines(self, lines):
        """Append whole lines (each ending in a newline), rotating between lines so
        no file passes the size limit unless one line alone does."""
        fcntl.flock(self.dfd, fcntl.LOCK_EX)
        try:
            self._take_up()
            self._write_lines(lines)
        finally:
            fcntl.flock(self.dfd, fcntl.LOCK_UN)

    def _take_up(self):
        """The file another writer may have appended to or rotated since our last lines."""
        st = os.fstat(self.fd)
        try:
            now = os.stat(self.name, dir_fd=self.dfd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            os.close(self.fd)
            self._open()
        else:
            self.length = st.st_size

    def _write_lines(self, lines):
        batch, batch_length = [], 0
        for line in lines:
            if self.length + batch_length + len(line) > self.size and self.length + batch_length:
                self._write(b"".join(batch))
                batch, batch_length = [], 0
                if self.length:
                    self.rotate()
            batch.append(line)
            batch_length += len(line)
        if batch:
            self._write(b"".join(batch))

    def _write(self, data):
        view = memoryview(data)
        while view:                     # what a full disk cut short is written once it can be
            view = view[persist(lambda: os.write(self.fd, view)):]
        self.length += len(data)

    def rotate(self):
        persist(lambda: os.fsync(self.fd))
        os.close(self.fd)
        rotated = log_names(os.listdir(self.dfd), self.name)[:-1]
        newest = os.path.basename(rotated[-1]) if rotated else ""
        t = time.time()
        # never onto an existing name (two rotations in one microsecond), never
        # sorting before an older file (a clock stepped back)
        while rotated_name(self.name, t) <= newest:
            t = max(t + 1e-6, stamp_time(newest))
        target = rotated_name(self.name, t)
        persist(lambda: os.rename(self.name, target, src_dir_fd=self.dfd, dst_dir_fd=self.dfd))
        self._open()
        for old in log_names(os.listdir(self.dfd), self.name)[:-1][:-self.count]:
            try:
                os.unlink(old, dir_fd=self.dfd)
            except FileNotFoundError:
                pass

    def close(self):
        os.close(self.fd)
        os.close(self.dfd)


class LiveLimits:
    """control/logsize and control/logcount, read again when either file changes."""

    def __init__(self, control):
        self.control = control
        self.seen = self._stamp()

    def _stamp(self):
        stamp = []
        for name in (SIZE_CONTROL, COUNT_CONTROL):
            try:
                st = os.stat(os.path.join(self.control, name))
                stamp.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamp.append(None)
        return stamp

    def changed(self):
        """(size, count) when a file changed since last asked, else None."""
        stamp = self._stamp()
        if stamp == self.seen:
            return None
        self.seen = stamp
        return limits(os.path.dirname(self.control))


def write_log(path, infd=0, size=DEFAULT_SIZE, count=DEFAULT_COUNT, control=None):
    """Copy lines from infd to path (rotating), each prefixed with an ISO-8601 UTC timestamp."""
    live = LiveLimits(control) if control else None
    if live:                        # the files as they are now, not as when the caller read them
        size, count = limits(os.path.dirname(control))
    out = RotatingLog(path, size, count)
    pending = b""
    while True:
        try:
            data = os.read(infd, 65536)
        except InterruptedError:
            continue
        if not data:
            break
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        if lines:
            new = live.changed() if live else None
            if new:
                out.size, out.count = new
            out.write_lines(stamped(lines))
    if pending:
        out.write_lines(stamped([pending]))
    out.close()
    return 0


def stamped(lines):
    """Lines (without their newlines) as the log holds them: each after the time now."""
    stamp = iso_now().encode() + b" "
    return [stamp + line + b"\n" for line in lines]


def open_for_append(home, name):
    """HOME/log/NAME (log/ made if missing) opened for qmailctl's own lines (limits from control/), beside the
    writer that may be appending to it: RotatingLog.write_lines(stamped(lines)). OSError
    (nofollow.Refused included) at once when it cannot be opened."""
    size, count = limits(home)
    hfd = nofollow.open_home(home)
    try:
        os.mkdir(LOG_DIR, 0o755, dir_fd=hfd)           # as qmailctl start makes it
    except FileExistsError:
        pass
    finally:
        os.close(hfd)
    return RotatingLog(os.path.join(home, LOG_DIR, name), size, count, wait=False)


def main(argv):
    """python -m qmailpy.ctl.logwriter PATH [SIZE COUNT [CONTROLDIR]]"""
    size, count = (int(argv[2]), int(argv[3])) if len(argv) >= 4 else (DEFAULT_SIZE, DEFAULT_COUNT)
    return write_log(argv[1], 0, size, count, argv[4] if len(argv) == 5 else None)


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv))
