"""The log backend's segment files as qmail-send reads and appends them.

Interface: Segments(state) with a LogState (state.py). Owns the file descriptors:
the shared LogWriter (appends and group commit, commit.py) and one read/write fd per
segment. Reads records at a position (read_at) and lists segments; appends records
(append), noting each to the commands' locators (state.locators); reports a
damaged stretch once (problem: state.problems, state.reported, state.damage, a
warning), copying a corrupt one's bytes to queue/log/quarantine/. Writes nothing
else. Record format: records.py and qmail-log-queue(5).
"""
import os

from qmailpy.backends.base import QueueError
from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import LogWriter, list_segments, segment_name

QUARANTINE = "quarantine"


class Segments:
    def __init__(self, state):
        self.state = state
        self._writer = None
        self._fds = {}

    @property
    def writer(self):
        if self._writer is None:
            self._writer = LogWriter(self.state.logdir, self.state.segment_limit)
        return self._writer

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def segment_fd(self, seg):
        """The read/write fd of segment seg (kept open), or None when it is gone."""
        fd = self._fds.get(seg)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.state.logdir, segment_name(seg)), os.O_RDWR)
            except FileNotFoundError:
                return None
            self._fds[seg] = fd
        return fd

    def forget(self, seg):
        """Close segment seg's fd and drop it from the writer (it is being deleted)."""
        fd = self._fds.pop(seg, None)
        if fd is not None:
            os.close(fd)
        self.writer.forget_segment(seg)

    def segments(self):
        return list_segments(self.state.logdir)

    def next_segment(self, seg):
        later = [s for s in self.segments() if s > seg]
        return min(later) if later else None

    def head_segment(self):
        if self._writer is None and not os.path.exists(os.path.join(self.state.logdir, "commit")):
            segments = self.segments()       # a reader must not create the log's files
            return segments[-1] if segments else 0
        return self.writer.head()[0]

    def read_at(self, pos):
        fd = self.segment_fd(pos[0])
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

    def problem(self, problem, data):
        """Report a torn or corrupt stretch once; keep a corrupt one's bytes in quarantine/."""
        state = self.state
        key = (problem.segment, problem.start)
        if key in state.reported:
            return
        state.reported.add(key)
        state.problems.append(problem)
        if problem.kind != R.FLAG:
            state.damage.append((problem.segment, problem.start))
        if problem.kind == R.CORRUPT:
            qdir = os.path.join(state.logdir, QUARANTINE)
            os.makedirs(qdir, 0o700, exist_ok=True)
            path = os.path.join(qdir, "%d.%d" % (problem.segment, problem.start))
            with open(path, "wb") as f:
                f.write(bytes(data[:problem.end - problem.start]))
                f.flush()
                os.fsync(f.fileno())
        state.warn(problem.describe())

    def flagged_garbage(self, flags, pos, length):
        """True for a record flagged garbage; a damaged flag is reported and read as live."""
        if flags == R.GARBAGE:
            return True
        if flags != R.LIVE:
            self.problem(R.flag_problem(flags, pos[0], pos[1], length), b"")
        return False

    # -- appending -------------------------------------------------------------
    def append(self, data, durable=False):
        """Append one or more records; the position of the first."""
        try:
            pos = self.writer.append(data, durable)
        except OSError as e:
            raise QueueError("trouble writing to log: %s" % e.strerror)
        if self.state.locators:            # a command is finding its messages (locator.py)
            self._note_appended(data, pos)
        return pos

    def _note_appended(self, data, pos):
        """Each record qmail-send appends, for the locators (locator.py)."""
        off = 0
        while off < len(data):
            length = R.frame_length(data, off)
            if length is None:
                return
            head = R.schedule(data, off)
            for locator in self.state.locators:
                locator.note(head[0], head[3], (pos[0], pos[1] + off))
            off += length

    def tail(self):
        head, end = self.writer.head()
        return (head, end) if head else (0, R.HEADER_SIZE)
