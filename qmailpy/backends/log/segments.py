"""The log backend's segment files as LogQueue reads and appends them.

LogSegments is the part of LogQueue (log/queue.py) that owns file descriptors: the
shared LogWriter (appends and group commit, log/commit.py), one read/write fd per
segment, reading one record at a position, and reporting damaged stretches (a
corrupt one is copied to queue/log/quarantine/). Record format: log/records.py and
qmail-log-queue(5).
"""
import os
import time

from qmailpy.backends.log import records as R
from qmailpy.backends.base import QueueError
from qmailpy.backends.log.commit import LogWriter, list_segments, segment_name

QUARANTINE = "quarantine"


def now():
    """Epoch seconds, as records carry them."""
    return int(time.time())


class LogSegments:
    """Mixin of LogQueue: needs self.logdir, self.segment_limit, self._writer, self._fds,
    self._log, self.problems, self._reported and self.locators (set up by LogQueue.__init__)."""

    @property
    def writer(self):
        if self._writer is None:
            self._writer = LogWriter(self.logdir, self.segment_limit)
        return self._writer

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _segment_fd(self, seg):
        fd = self._fds.get(seg)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.logdir, segment_name(seg)), os.O_RDWR)
            except FileNotFoundError:
                return None
            self._fds[seg] = fd
        return fd

    def _segments(self):
        return list_segments(self.logdir)

    def _next_segment(self, seg):
        later = [s for s in self._segments() if s > seg]
        return min(later) if later else None

    def _head_segment(self):
        if self._writer is None and not os.path.exists(os.path.join(self.logdir, "commit")):
            segments = self._segments()       # a reader must not create the log's files
            return segments[-1] if segments else 0
        return self.writer.head()[0]

    def _read_at(self, pos):
        fd = self._segment_fd(pos[0])
        if fd is None:
            raise QueueError("log segment %d is missing" % pos[0])
        head = os.pread(fd, R.RECORD_HEADER_SIZE, pos[1])
        if len(head) < R.RECORD_HEADER_SIZE:
            raise QueueError("trouble reading log segment %d" % pos[0])
        length = R.RECORD_HEADER.unpack(head)[3]
        data = head + os.pread(fd, length, pos[1] + R.RECORD_HEADER_SIZE)
        rec = R.decode_one(data, 0)
        if rec is None:
            raise QueueError("trouble reading log segment %d at %d" % pos)
        rec.pos = pos
        return rec

    def _warn(self, text):
        if self._log is not None:
            self._log(b"warning: " + text.encode("utf-8", "surrogateescape") + b"\n")

    def _problem(self, problem, data):
        """Report a torn or corrupt stretch once; keep a corrupt one's bytes in quarantine/."""
        key = (problem.segment, problem.start)
        if key in self._reported:
            return
        self._reported.add(key)
        self.problems.append(problem)
        if problem.kind != R.FLAG:
            self.damage.append((problem.segment, problem.start))
        if problem.kind == R.CORRUPT:
            qdir = os.path.join(self.logdir, QUARANTINE)
            os.makedirs(qdir, 0o700, exist_ok=True)
            path = os.path.join(qdir, "%d.%d" % (problem.segment, problem.start))
            with open(path, "wb") as f:
                f.write(bytes(data[:problem.end - problem.start]))
                f.flush()
                os.fsync(f.fileno())
        self._warn(problem.describe())

    def _flagged_garbage(self, flags, pos, length):
        """True for a record flagged garbage; a damaged flag is reported and read as live."""
        if flags == R.GARBAGE:
            return True
        if flags != R.LIVE:
            self._problem(R.flag_problem(flags, pos[0], pos[1], length), b"")
        return False

    # -- appending -------------------------------------------------------------
    def _append(self, data, durable=False):
        try:
            pos = self.writer.append(data, durable)
        except OSError as e:
            raise QueueError("trouble writing to log: %s" % e.strerror)
        if self.locators:                 # a command is finding its messages (log/locator.py)
            self._note_appended(data, pos)
        return pos

    def _tail(self):
        head, end = self.writer.head()
        return (head, end) if head else (0, R.HEADER_SIZE)

