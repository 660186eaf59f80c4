"""The log-structured queue backend (docs/architecture.md "Queue backends", after Tony Finch's log-structured MTA queue).

Message bodies stay in mess/ exactly as in the directory backend. Everything else
is records appended to segments under queue/log/ (format: logrecords.py, man
qmail-log-queue(5)); appends and group commit: logcommit.py.

A message's S5 state is its latest *snapshot* (PREPROCESSED or REPLACEMENT: sender,
birth, both channels' recipients with done marks and next-attempt times, bounce
notes) plus the deltas appended after it (START, DELIVERY, BOUNCE-NOTE). Whenever
a message stops being worked on (a pass is rescheduled or a channel finished) a
REPLACEMENT folds the deltas into a new snapshot and the old one becomes garbage
(flag byte written in place). So a message nobody is working on is exactly one
live record, and qmail-send keeps in memory only messages in flight (`active`).

Finding work without an index: queue runners, each a cursor that walks the log a
fixed lag behind the head (RUNNER_LAGS). A runner meeting a live snapshot whose
next attempt is due offers it; one not due yet is left to the slowest runner
that will still meet it before it is due; the runner that owns it remembers
(due, position) in a heap and walks on, so a record written later but due
sooner is not held up behind it. The heap is bounded (RUNNER_HELD); a full heap
makes the runner wait at the record instead. A runner's restart position is the
oldest of its cursor and its heap, so nothing it passed is lost in a crash.
Deferred messages move to the head with each REPLACEMENT, so old segments empty.

Durability: ENVELOPE (qmail-queue) and DELIVERY records are fsync'd before
success is reported, shared between processes (group commit). Everything else is
bookkeeping. Every CHECKPOINT_EVERY seconds: fsync the head; only then write the
garbage flags of records superseded since the last checkpoint (a flag must never
reach the disk before the record that supersedes it), delete all-garbage segments,
fsync the segments that got flags, and write queue/log/checkpoint (the restart
positions): the replay position, the runners' positions, live-record counts per
segment, the ENVELOPEs not yet preprocessed and the messages in flight.

Recovery (startup) reads the checkpoint and only the working suffix: from the
replay position, or from the first delta of a message in flight if earlier. A
torn tail is cut off and reported; a corrupt record in the middle is copied to
queue/log/quarantine/ and reported. Passes that were in flight (START without a
REPLACEMENT or FINISH) are reconciled: a REPLACEMENT with their remaining
recipients due now. It never reads the rest of the queue.

Wiring (see the report): qmail-send adds `due(now)` entries to its schedule each
loop, wakes at `next_wakeup()`, and forgets an entry when `reschedule()` returns
True (the runners will offer it again). DirQueue inherits defaults that keep
today's behaviour.
"""
import heapq
import json
import os
import signal
import time

from qmailpy import logline, states
from qmailpy.backends import logrecords as R
from qmailpy.backends.base import CleanerLost, MessageView, Preprocessed, QueueBackend, QueueError, Scheduled
from qmailpy.backends.logcommit import (LOG_DIR, SEGMENT_LIMIT_CONTROL, LogWriter, fsync_dir, list_segments,
                                        read_segment_limit, segment_name)
from qmailpy.envelope import ChannelRecord
from qmailpy.layout import CHANNELS, SPLIT, is_number, relpath
from qmailpy.states import LEFTOVER_AGE

# Runner lags (seconds behind the head). qmail's retry intervals run from 100 s
# to about 9 h; a deferred message is met no earlier than it is due and at most
# one lag step late.
RUNNER_LAGS = (0, 60, 300, 900, 2700, 7200, 21600)
RUNNER_BATCH = 2000           # records one runner looks at per due() call
RUNNER_HELD = 4096            # not-yet-due snapshots one runner remembers having passed
FLUSH_IN_FLIGHT = 1000        # run_all_now(): messages offered at once
CHECKPOINT_EVERY = 5
CHECKPOINT = "checkpoint"
QUARANTINE = "quarantine"
_CHUNK = 256 * 1024
# Test hook (crash tests): with QMAILPY_LOG_KILL_AT=K in its environment, the process
# SIGKILLs itself right after its K-th record append reaches the segment file. Read
# once per LogQueue; counted here and not in LogWriter, so that only the process
# driving the LogQueue (qmail-send) counts, not a qmail-queue child it forks.
KILL_AT_ENV = "QMAILPY_LOG_KILL_AT"


def _kill_at_from_env():
    value = os.environ.get(KILL_AT_ENV)
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _now():
    return int(time.time())


class _Active:
    """A message qmail-send is working on: its snapshot state plus deltas since."""
    __slots__ = ("n", "snap", "sender", "birth", "qp", "uid", "size", "notes", "channels",
                 "passes", "offered", "delta_start", "failed")

    def __init__(self, n, snap_pos, rec):
        self.n, self.snap = n, snap_pos
        f = rec.fields
        self.sender, self.birth, self.qp, self.uid, self.size = (
            f["sender"], f["birth"], f["qp"], f["uid"], f["size"])
        self.notes = bytearray(f["notes"])
        self.channels = {c: [due, [list(r) for r in rcpts]] for c, (due, rcpts) in f["channels"].items()}
        self.passes = set()          # channels with a START and no REPLACEMENT yet
        self.offered = set()         # channels (None = completion) handed to qmail-send
        self.delta_start = None      # position of the first delta after snap
        self.failed = False          # a bounce note since the last DELIVERY

    def channel_state(self):
        return {c: (due, [(bool(d), a) for d, a in rcpts]) for c, (due, rcpts) in self.channels.items()}


class _Cursor:
    """Reads records forward from a position, a buffer at a time, across segments."""

    def __init__(self, queue, pos):
        self.q = queue
        self.seg, self.off = pos
        self.buf, self.buf_off = b"", 0

    @property
    def pos(self):
        return (self.seg, self.off)

    def invalidate(self):
        self.buf, self.buf_off = b"", 0

    def _locate(self):
        """(buffer, offset in it, length) of the valid record at the cursor, or None."""
        while True:
            rel = self.off - self.buf_off
            if 0 <= rel < len(self.buf):
                length = R.frame_length(self.buf, rel)
                if length is not None:
                    return self.buf, rel, length
            fd = self.q._segment_fd(self.seg)
            size = os.fstat(fd).st_size if fd is not None else 0
            head, end = self.q.writer.head()
            if self.seg == head:
                # Never past the committed end: beyond it lie records being written, or
                # the remains of an appender that died, which the next appender overwrites.
                size = min(size, end)
            if self.off >= size:
                nxt = self.q._next_segment(self.seg)
                if nxt is None or fd is not None and self.seg == head:
                    return None
                self.seg, self.off = nxt, R.HEADER_SIZE
                self.invalidate()
                continue
            data = os.pread(fd, min(_CHUNK, size - self.off), self.off)
            self.buf, self.buf_off = data, self.off
            if R.frame_length(data, 0) is not None:
                continue
            # Incomplete in the buffer, growing, torn or corrupt: look at the rest.
            rest = os.pread(fd, size - self.off, self.off)
            if R.frame_length(rest, 0) is not None:
                self.buf = rest
                continue
            resume = R._resync(rest, 1)
            if resume is None:
                if self.seg == head:
                    return None          # a torn tail: recovery cuts it
                self.q._problem(R.Problem(R.TORN, self.seg, self.off, size), rest)
                self.off = size
            else:
                self.q._problem(R.Problem(R.CORRUPT, self.seg, self.off, self.off + resume),
                                rest[:resume])
                self.off += resume
            self.invalidate()

    def peek(self):
        """The decoded record at the cursor, or None when no complete record is there yet."""
        while True:
            found = self._locate()
            if found is None:
                return None
            buf, rel, length = found
            rec = R.decode_one(buf, rel)
            if rec is not None:
                rec.pos = (self.seg, self.off)
                return rec
            self.q._problem(R.Problem(R.CORRUPT, self.seg, self.off, self.off + length),
                            buf[rel:rel + length])
            self.off += length

    def peek_schedule(self):
        """(type, flags, time, n, dues, length) of the record at the cursor, or None."""
        found = self._locate()
        if found is None:
            return None
        buf, rel, length = found
        return R.schedule(buf, rel) + (length,)

    def advance(self, rec):
        self.off = rec.pos[1] + rec.length

    def skip(self, length):
        self.off += length


class _Runner:
    __slots__ = ("lag", "cursor", "wake", "held", "parked")

    def __init__(self, lag, cursor):
        self.lag, self.cursor, self.wake = lag, cursor, 0
        self.held = []               # heap of (due, position) of snapshots it owns and passed
        self.parked = False          # stopped at a record it cannot pass before `wake`

    def idle(self, now, tail):
        """True when a walk now could find nothing: nothing held is due, and the cursor
        is parked before `wake` or waits at a tail that has not moved."""
        if self.wake and self.wake <= now:
            return False
        return self.parked or self.cursor.pos == tail

    def hold(self, due, pos):
        heapq.heappush(self.held, (due, pos))
        self.wait_until(due)

    def wait_until(self, when):
        self.wake = min(self.wake, when) if self.wake else when

    def restart_pos(self):
        return min([self.cursor.pos] + [pos for _, pos in self.held])


class LogQueue(QueueBackend):
    name = "log"

    def __init__(self, home, cleaner=None, log=None, segment_limit=None,
                 runner_lags=RUNNER_LAGS):
        self.home = home
        self.queue = os.path.join(home, "queue")
        self.logdir = os.path.join(self.queue, LOG_DIR)
        self.cleaner = cleaner
        self._log = log
        if segment_limit is None:           # control/logsegmentsize, as qmail-queue reads it
            segment_limit = read_segment_limit(os.path.join(home, "control", SEGMENT_LIMIT_CONTROL))
        self.segment_limit = segment_limit
        self.runner_lags = tuple(runner_lags)
        self._writer = None
        self._fds = {}
        self.active = {}
        self.pending_new = {}
        self.live = {}
        self.garbage = set()          # superseded positions whose flag is not yet written
        self.runners = []
        self.new_cursor = None
        self.problems = []            # Problems reported by this process
        self._reported = set()
        self.last_checkpoint = 0
        self.recovered = False
        self.flusher = None           # (cursor, stop) of a run_all_now() sweep
        self.to_clean = []            # finished messages whose mess/ file goes after the next fsync
        self._kill_at = _kill_at_from_env()   # test hook (KILL_AT_ENV); 0 = off
        self._appends = 0

    # -- files ---------------------------------------------------------------
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
        if self._kill_at:
            self._appends += 1
            if self._appends >= self._kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return pos

    def _count(self, pos, delta):
        seg = pos[0]
        self.live[seg] = self.live.get(seg, 0) + delta

    def _supersede(self, old_pos):
        if old_pos != R.NOWHERE:
            self._count(old_pos, -1)
            self.garbage.add(old_pos)

    def _write_snapshot(self, a, type=R.REPLACEMENT, ended=(), now=None):
        now = _now() if now is None else now
        data = R.encode_snapshot(type, now, a.n, a.snap, a.birth, a.qp, a.uid, a.size, a.sender,
                                 bytes(a.notes), ended, a.channel_state())
        pos = self._append(data)
        self._supersede(a.snap)
        self._count(pos, 1)
        a.snap, a.delta_start = pos, None
        return pos

    # -- startup and recovery ----------------------------------------------------
    def startup(self):
        self.recover()
        return self.due(_now())

    def _read_checkpoint(self):
        try:
            with open(os.path.join(self.logdir, CHECKPOINT), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            body, crc = data.rsplit(b"\n", 1)[0].rsplit(b" ", 1)
            if int(crc) != R.crc32c(body):
                raise ValueError("checksum")
            return json.loads(body)
        except ValueError:
            self._warn("log checkpoint is damaged; scanning the whole log")
            return None

    def recover(self):
        """Rebuild the in-memory state from the checkpoint and the working suffix."""
        segments = self._segments()
        cp = self._read_checkpoint()
        first = (segments[0], R.HEADER_SIZE) if segments else (0, R.HEADER_SIZE)
        if cp is None:
            replay = first
            self.live, self.pending_new = {}, {}
            runner_pos = [first] * len(self.runner_lags)
            carried = {}
        else:
            replay = tuple(cp["replay"])
            self.live = {int(k): v for k, v in cp["counts"].items()}
            self.pending_new = {int(k): tuple(v) for k, v in cp["pending"].items()}
            saved = [tuple(p) for p in cp["runners"]]
            runner_pos = (saved + [replay] * len(self.runner_lags))[:len(self.runner_lags)]
            carried = {int(k): (tuple(v[0]), tuple(v[1]) if v[1] else None, v[2])
                       for k, v in cp["active"].items()}
        start = min([replay] + [d for _, d, _ in carried.values() if d])
        self.active = {}
        for n, (snap, _, passes) in carried.items():
            try:
                a = self._active_at(n, snap)
            except QueueError as e:
                self._warn("cannot reload message %d for recovery: %s" % (n, e))
                continue
            a.passes = set(passes) & set(a.channels)
        with self.writer.locked():
            tail = self._replay(start, replay, segments)
        self._reconcile()
        self.new_cursor = _Cursor(self, tail)
        self.runners = [_Runner(lag, _Cursor(self, pos)) for lag, pos in zip(self.runner_lags, runner_pos)]
        self.recovered = True
        self.checkpoint(force=True)

    def _tail(self):
        head, end = self.writer.head()
        return (head, end) if head else (0, R.HEADER_SIZE)

    def _active_at(self, n, snap):
        a = _Active(n, snap, self._read_at(snap))
        self.active[n] = a
        return a

    def _replay(self, start, replay, segments):
        """Apply the records from start; before `replay` only deltas of carried messages.

        Returns the tail: where the log really ends (the caller holds the append lock)."""
        tail = start
        for seg in [s for s in segments if s >= start[0]]:
            fd = self._segment_fd(seg)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            try:
                R.parse_segment_header(data)
            except R.RecordError as e:
                self._warn("log segment %d: %s; quarantined" % (seg, e))
                self._problem(R.Problem(R.CORRUPT, seg, 0, len(data)), data)
                continue
            offset = start[1] if seg == start[0] else R.HEADER_SIZE
            records, problems, end = R.decode(data, seg, offset, final=True)
            for p in problems:
                self._problem(p, data[p.start:p.end])
            if seg == segments[-1]:
                # The head: cut any torn tail so appenders continue after good data.
                self.writer.reset_end(seg, end)
            for rec in records:
                self._apply(rec, rec.pos >= replay)
            tail = (seg, end)
        return tail

    def _apply(self, rec, counting):
        n, t = rec.n, rec.type
        if not counting:
            a = self.active.get(n)
            if a is not None and rec.pos > a.snap:
                self._apply_delta(a, rec)
            return
        if t == R.ENVELOPE:
            # Numbers are mess/ inodes: an ENVELOPE after a FINISH of the same number is
            # a new message on the inode freed by that FINISH's clean, so mess/S/n is its
            # body now and must not be cleaned for the old one.
            if n in self.to_clean:
                self.to_clean = [m for m in self.to_clean if m != n]
            self._count(rec.pos, 1)              # its PREPROCESSED, if any, follows and uncounts it
            if not self._flagged_garbage(rec.flags, rec.pos, rec.length):
                self.pending_new[n] = rec.pos
        elif t in R.SNAPSHOTS:
            if t == R.PREPROCESSED:
                self.pending_new.pop(n, None)
            self._supersede(rec.prev)
            self._count(rec.pos, 1)
            a = self.active.get(n)
            if a is not None:
                keep = (a.passes - set(rec.ended)) & set(rec.channels)
                fresh = _Active(n, rec.pos, rec)
                fresh.passes = keep
                self.active[n] = fresh
                if not keep:
                    del self.active[n]
        elif t == R.FINISH:
            self._supersede(rec.prev)
            self.active.pop(n, None)
            self.to_clean.append(n)              # the crash may have come before its unlink
        elif t == R.START:
            a = self.active.get(n)
            if a is None or a.snap != rec.snapshot:
                try:
                    a = self._active_at(n, rec.snapshot)
                except QueueError as e:
                    self._warn("START for message %d names a lost snapshot: %s" % (n, e))
                    return
            a.passes.add(rec.channel)
        else:
            a = self.active.get(n)
            if a is not None:
                self._apply_delta(a, rec)

    @staticmethod
    def _apply_delta(a, rec):
        if rec.type == R.START:
            a.passes.add(rec.channel)
        elif rec.type == R.DELIVERY:
            chan = a.channels.get(rec.channel)
            if chan is not None and rec.index < len(chan[1]):
                chan[1][rec.index][0] = True
        elif rec.type == R.BOUNCE_NOTE:
            if rec.op == R.NOTE_CLEAR:
                a.notes = bytearray()
            else:
                a.notes += rec.note

    def _reconcile(self):
        """Half-finished passes: a REPLACEMENT with what is left, due now."""
        now = _now()
        for n, a in sorted(self.active.items()):
            for c in a.passes:
                if c in a.channels:
                    a.channels[c][0] = min(a.channels[c][0], now)
            self._write_snapshot(a, ended=tuple(a.passes), now=now)
        self.active = {}

    # -- checkpoints -------------------------------------------------------------
    def checkpoint(self, force=False, now=None):
        now = _now() if now is None else now
        if not force and now < self.last_checkpoint + CHECKPOINT_EVERY:
            return
        self.last_checkpoint = now
        self._scan_new()
        replay = self.new_cursor.pos
        try:
            self.writer.sync_to(*replay)
        except OSError as e:
            self._warn("trouble fsyncing log: %s" % e.strerror)
            return
        flagged = set()
        for pos in sorted(self.garbage):
            fd = self._segment_fd(pos[0])
            if fd is None:
                continue
            try:
                os.pwrite(fd, bytes((R.GARBAGE,)), pos[1] + R.FLAGS_OFFSET)
                flagged.add(pos[0])
            except OSError:
                pass
        self.garbage.clear()
        cleaning, self.to_clean = self.to_clean, []
        for i, n in enumerate(cleaning):
            try:
                self._clean(n)
            except CleanerLost:
                # qmail-send must exit (docs/qmail-send.md "Signals"); no checkpoint is written, so a
                # restart replays these FINISH records and cleans their bodies then.
                self.to_clean = cleaning[i:] + self.to_clean
                raise
        for r in self.runners:
            r.cursor.invalidate()
        self.new_cursor.invalidate()
        self._delete_garbage_segments(replay)
        try:
            for seg in flagged:
                fd = self._segment_fd(seg)
                if fd is not None:
                    os.fsync(fd)
            self._write_checkpoint(replay)
        except OSError as e:
            self._warn("trouble writing log checkpoint: %s" % e.strerror)

    def _pinned_from(self, replay):
        # Runners need no pin: a cursor in a deleted segment moves to the next one.
        pins = [replay, self._tail()]
        for a in self.active.values():
            pins.append(a.snap)
            if a.delta_start:
                pins.append(a.delta_start)
        pins.extend(self.pending_new.values())
        return min(p[0] for p in pins)

    def _delete_garbage_segments(self, replay):
        pinned = self._pinned_from(replay)
        for seg in self._segments():
            if seg >= pinned:
                break
            if self.live.get(seg, 0) <= 0:
                fd = self._fds.pop(seg, None)
                if fd is not None:
                    os.close(fd)
                self.writer.forget_segment(seg)
                try:
                    os.unlink(os.path.join(self.logdir, segment_name(seg)))
                except OSError:
                    continue
                self.live.pop(seg, None)

    def _write_checkpoint(self, replay):
        runners = [list(r.restart_pos()) for r in self.runners]
        body = json.dumps({
            "version": 1, "replay": list(replay), "runners": runners,
            "counts": {str(k): v for k, v in self.live.items() if v > 0},
            "pending": {str(n): list(p) for n, p in self.pending_new.items()},
            "active": {str(n): [list(a.snap), list(a.delta_start) if a.delta_start else None,
                                sorted(a.passes)] for n, a in self.active.items()},
        }, separators=(",", ":")).encode()
        data = body + b" %d\n" % R.crc32c(body)
        tmp = os.path.join(self.logdir, CHECKPOINT + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o660)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self.logdir, CHECKPOINT))
        fsync_dir(self.logdir)

    # -- new work --------------------------------------------------------------
    def _scan_new(self):
        """Read what others appended since last time; remember unpreprocessed ENVELOPEs."""
        if self.new_cursor is None:
            self.recover()
        cur = self.new_cursor
        while True:
            head = cur.peek_schedule()
            if head is None:
                return
            type, flags, _, n, _, length = head
            pos = cur.pos
            if (type == R.ENVELOPE and pos not in self.garbage
                    and not self._flagged_garbage(flags, pos, length)):
                if n not in self.pending_new:
                    self.pending_new[n] = pos
                    self._count(pos, 1)
            cur.skip(length)

    def new_work(self):
        try:
            self._scan_new()
        except OSError as e:
            raise QueueError("unable to read log: %s" % e.strerror)
        return list(self.pending_new)

    def preprocess_batch(self, numbers, route, announce=None):
        """As the base class, but `new msg` and `info msg` are announced before the
        PREPROCESSED record is appended: a crash may then repeat them, never lose them
        (qmail logs both before todo/ is cleaned)."""
        results = []
        for n in numbers:
            try:
                results.append((n, self.preprocess(n, route, announce)))
            except QueueError as e:
                results.append((n, e))
        return results

    def preprocess(self, n, route, announce=None):
        pos = self.pending_new.get(n)
        if pos is None:
            raise QueueError("unable to open todo/%d" % n)
        env = self._read_at(pos)
        if env.type != R.ENVELOPE or env.n != n:
            del self.pending_new[n]
            raise QueueError("unable to open todo/%d" % n)
        mess = relpath("mess", n)
        try:
            size = os.stat(os.path.join(self.queue, mess)).st_size
        except OSError:
            raise QueueError("unable to stat %s" % mess)
        now = _now()
        channels = {}
        for rcpt in env.recipients:
            channel, address = route(rcpt)
            channels.setdefault(channel, [now, []])[1].append((False, address))
        data = R.encode_snapshot(R.PREPROCESSED, now, n, pos, now, env.qp, env.uid, size, env.sender,
                                 b"", (), {c: (d, r) for c, (d, r) in channels.items()})
        if announce is not None:
            announce(logline.new_msg(n))
            announce(logline.info_msg(n, size, env.sender, env.qp, env.uid))
        spos = self._append(data)
        del self.pending_new[n]
        self._supersede(pos)
        self._count(spos, 1)
        a = _Active(n, spos, self._read_at(spos))
        a.offered = set(a.channels) or {None}
        self.active[n] = a
        return Preprocessed(n, env.sender, size, env.qp, env.uid, now,
                            tuple(c for c in CHANNELS if c in channels))

    # -- queue runners -------------------------------------------------------------
    def due(self, now=None):
        """Scheduled entries the runners found due (channel None = completion)."""
        now = _now() if now is None else now
        if not self.recovered:
            self.recover()
        found = []
        tail = self._tail()                      # one read of the commit word, not one per runner
        for i, r in enumerate(self.runners):
            if r.idle(now, tail):
                continue
            slower = self.runner_lags[i + 1] if i + 1 < len(self.runners) else None
            self._walk(r, slower, now, found)
        if self.flusher is not None:
            self._flush(now, found)
        self.checkpoint(now=now)
        return found

    def _walk(self, r, slower, now, found):
        self._offer_held(r, now, found)
        cur = r.cursor
        r.wake = r.held[0][0] if r.held else 0
        r.parked = False
        garbage, active = self.garbage, self.active
        for _ in range(RUNNER_BATCH):
            head = cur.peek_schedule()
            if head is None:
                return
            type, flags, written, n, dues, length = head
            if written + r.lag > now:
                r.wait_until(written + r.lag)
                r.parked = True
                return
            if (dues is not None and n not in active and (cur.seg, cur.off) not in garbage
                    and not self._flagged_garbage(flags, cur.pos, length)):
                ready = [c for c, due in dues.items() if due <= now]
                if not dues or ready:
                    rec = cur.peek()
                    if rec is None:
                        return
                    self._offer(rec, ready or [None], now, found)
                else:
                    t = min(dues.values())
                    if slower is None or written + slower > t:
                        if len(r.held) >= RUNNER_HELD:
                            r.wait_until(t)      # heap full: wait here
                            r.parked = True
                            return
                        r.hold(t, cur.pos)       # this runner owns it
            cur.skip(length)
        r.wake = now                             # more to read: come back at once

    def _offer_held(self, r, now, found):
        """Offer the snapshots this runner passed before they were due, now due."""
        while r.held and r.held[0][0] <= now:
            _, pos = heapq.heappop(r.held)
            if pos in self.garbage:
                continue
            try:
                rec = self._read_at(pos)
            except QueueError:
                continue                         # its segment is gone: it was garbage
            if (rec.type not in R.SNAPSHOTS or rec.n in self.active
                    or self._flagged_garbage(rec.flags, pos, rec.length)):
                continue
            ready = [c for c, (due, _) in rec.channels.items() if due <= now]
            self._offer(rec, ready or [None], now, found)

    def run_all_now(self):
        """SIGALRM (docs/qmail-send.md "Signals"): offer every queued channel now, whatever its schedule.

        A sweep from the oldest segment to the present tail, offering at most
        FLUSH_IN_FLIGHT messages at a time so memory stays bounded."""
        segments = self._segments()
        if segments:
            self.flusher = (_Cursor(self, (segments[0], R.HEADER_SIZE)), self._tail())

    def _flush(self, now, found):
        cur, stop = self.flusher
        for _ in range(RUNNER_BATCH):
            if len(self.active) >= FLUSH_IN_FLIGHT:
                return
            if cur.pos >= stop:
                self.flusher = None
                return
            head = cur.peek_schedule()
            if head is None:
                self.flusher = None
                return
            type, flags, _, n, dues, length = head
            if (dues is not None and n not in self.active and cur.pos not in self.garbage
                    and not self._flagged_garbage(flags, cur.pos, length)):
                rec = cur.peek()
                if rec is None:
                    return
                self._offer(rec, list(dues) or [None], now, found, at=now)
            cur.skip(length)

    def _offer(self, rec, channels, now, found, at=None):
        a = _Active(rec.n, rec.pos, rec)
        a.offered = set(channels)
        self.active[rec.n] = a
        for c in channels:
            found.append(Scheduled(rec.n, c, now if c is None or at is not None else a.channels[c][0]))

    def next_wakeup(self):
        """Epoch second when due() may find more (None: nothing pending)."""
        wakes = [r.wake for r in self.runners if r.wake]
        if self.flusher is not None:
            wakes.append(0)
        if self.garbage or self.active or self.to_clean:
            wakes.append(self.last_checkpoint + CHECKPOINT_EVERY)
        return min(wakes) if wakes else None

    # -- deliveries ------------------------------------------------------------------
    def _get(self, n):
        a = self.active.get(n)
        if a is None:
            raise QueueError("message %d is not in flight" % n)
        return a

    def message_path(self, n):
        return "%d/%d" % (n % SPLIT, n)

    def info(self, n):
        a = self._get(n)
        return a.sender, a.birth

    def recipients(self, n, channel):
        a = self.active.get(n)
        if a is None or channel not in a.channels:
            raise QueueError("trouble opening %s; will try again later" % self.channel_file(n, channel))
        if channel not in a.passes:
            pos = self._append(R.encode_start(_now(), n, a.snap, channel))
            a.passes.add(channel)
            a.offered.add(channel)
            if a.delta_start is None:
                a.delta_start = pos
        return [ChannelRecord(i, bool(done), addr) for i, (done, addr) in enumerate(a.channels[channel][1])]

    def mark_done(self, n, channel, record):
        a = self._get(n)
        result = R.FAILURE if a.failed else R.SUCCESS
        pos = self._append(R.encode_delivery(_now(), n, channel, record.offset, result), durable=True)
        if a.delta_start is None:
            a.delta_start = pos
        a.channels[channel][1][record.offset][0] = True
        a.failed = False
        record.done = True

    def add_bounce_note(self, n, note):
        a = self._get(n)
        pos = self._append(R.encode_bounce_note(_now(), n, R.NOTE_ADD, note))
        if a.delta_start is None:
            a.delta_start = pos
        a.notes += note
        a.failed = True

    def _settle(self, a):
        if not a.offered and not a.passes:
            del self.active[a.n]

    def finish_channel(self, n, channel):
        a = self._get(n)
        a.channels.pop(channel, None)
        a.passes.discard(channel)
        self._write_snapshot(a, ended=(channel,))
        a.offered.discard(channel)
        if not a.channels:
            a.offered.add(None)                  # qmail-send schedules completion next
        self._settle(a)

    def reschedule(self, n, channel, when):
        """Write the REPLACEMENT; True = the runners will offer it again at `when`."""
        a = self._get(n)
        if channel in a.channels:
            a.channels[channel][0] = int(when)
        a.passes.discard(channel)
        self._write_snapshot(a, ended=(channel,))
        a.offered.discard(channel)
        self._settle(a)
        return True

    def channels_left(self, n):
        return [c for c in CHANNELS if c in self._get(n).channels]

    def completion_due(self, n):
        a = self.active.get(n)
        return a is not None and not a.channels

    def recheck(self, n):
        return []

    # -- completion ----------------------------------------------------------------------
    def bounce_notes(self, n):
        a = self._get(n)
        return bytes(a.notes) if a.notes else None

    def drop_bounce_notes(self, n):
        """The bounce is queued: a fresh snapshot without the notes replaces the old one.

        (A bare NOTE_CLEAR after the message's last snapshot is not replayed for a
        message that is no longer in flight, so a crash before FINISH would send
        the bounce again.)"""
        a = self._get(n)
        a.notes = bytearray()
        self._write_snapshot(a)

    def complete(self, n):
        """FINISH now; the mess file goes at the next checkpoint, once FINISH is on disk.

        (Unlinking it first could leave, after a power cut, a live message whose body
        is gone.) A number that is not in flight is a stale leftover: cleaned at once."""
        a = self.active.pop(n, None)
        if a is None:
            self._clean(n)
            return
        self._append(R.encode_finish(_now(), n, a.snap))
        self._supersede(a.snap)
        self.to_clean.append(n)

    def _clean(self, n):
        foop = "foop/%d" % n
        if self.cleaner is not None:
            if self.cleaner.request(foop) != b"+":
                self._warn("qmail-clean unable to clean up %s" % foop)
            return
        try:
            os.unlink(os.path.join(self.queue, relpath("mess", n)))
        except FileNotFoundError:
            pass
        except OSError:
            self._warn("qmail-clean unable to clean up %s" % foop)

    def save_schedule(self, entries):
        touched = {}
        for n, channel, when in entries:
            a = self.active.get(n)
            if a is not None and channel in a.channels:
                a.channels[channel][0] = int(when)
                touched[n] = a
        for a in touched.values():
            self._write_snapshot(a)
        try:
            self.checkpoint(force=True)
        except CleanerLost:
            pass                              # exiting anyway; recovery cleans up

    def stale_messages(self, now):
        """mess/ files older than 36 h that no live record names (none while anything is quarantined)."""
        try:
            quarantined = os.listdir(os.path.join(self.logdir, QUARANTINE))
        except FileNotFoundError:
            quarantined = []
        if quarantined:
            self._warn("log has quarantined records; stale message cleanup skipped")
            return
        candidates = set()
        for s in range(SPLIT):
            d = os.path.join(self.queue, "mess", str(s))
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for name in names:
                if is_number(name):
                    try:
                        st = os.stat(os.path.join(d, name))
                    except OSError:
                        continue
                    if now > st.st_atime + LEFTOVER_AGE:
                        candidates.add(int(name))
        if not candidates:
            return
        candidates -= set(self.active) | set(self.pending_new)
        for rec in self.scan():
            if not rec.garbage and rec.type in (R.ENVELOPE,) + R.SNAPSHOTS:
                candidates.discard(rec.n)
        yield from sorted(candidates)

    # -- readers -------------------------------------------------------------------------
    def scan(self, report=True):
        """Every record of every segment, in log order (readers and conversion)."""
        for seg in self._segments():
            fd = self._segment_fd(seg)
            if fd is None:
                continue
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            try:
                R.parse_segment_header(data)
            except R.RecordError:
                continue
            head = seg == self._head_segment()
            records, problems, _ = R.decode(data, seg, final=not head)
            if report:
                for p in problems:
                    self._warn(p.describe())
            yield from records

    def latest_states(self):
        """{n: [state, record fields...]} of every message in the log (a reader's full scan)."""
        msgs = {}
        for rec in self.scan():
            n, t = rec.n, rec.type
            if t == R.ENVELOPE:
                if n not in msgs:
                    msgs[n] = {"state": states.S4, "rec": rec, "done": {}, "notes": b""}
            elif t in R.SNAPSHOTS:
                msgs[n] = {"state": states.S5, "rec": rec, "done": {}, "notes": rec.notes}
            elif t == R.FINISH:
                msgs.pop(n, None)
            elif n in msgs and msgs[n]["state"] == states.S5:
                m = msgs[n]
                if t == R.DELIVERY:
                    m["done"][(rec.channel, rec.index)] = True
                elif t == R.BOUNCE_NOTE:
                    m["notes"] = b"" if rec.op == R.NOTE_CLEAR else m["notes"] + rec.note
        return msgs

    def list_messages(self):
        views = []
        for n, m in self.latest_states().items():
            if m["state"] != states.S5:
                continue
            rec = m["rec"]
            chans = {}
            for c in CHANNELS:
                _, rcpts = rec.channels.get(c, (0, []))
                chans[c] = [ChannelRecord(i, done or (c, i) in m["done"], addr)
                            for i, (done, addr) in enumerate(rcpts)]
            views.append(MessageView(n, states.S5, rec.birth, rec.size, rec.sender,
                                     chans["local"], chans["remote"], bool(m["notes"])))
        views.sort(key=lambda v: (v.n % SPLIT, v.n))
        return views

    def counts(self):
        """(mess/ files, ENVELOPEs not yet preprocessed), as qmail-qstat prints them.

        A body whose message has a FINISH as its last record is not counted: it is
        gone from the queue and only waits for the next checkpoint to be unlinked
        (see complete()), where qmail-clean would already have removed it."""
        latest, finished = {}, set()
        for rec in self.scan():
            if rec.type == R.ENVELOPE:
                latest.setdefault(rec.n, states.S4)
                finished.discard(rec.n)
            elif rec.type in R.SNAPSHOTS:
                latest[rec.n] = states.S5
            elif rec.type == R.FINISH:
                latest.pop(rec.n, None)
                finished.add(rec.n)
        in_mess = 0
        for s in range(SPLIT):
            try:
                in_mess += sum(1 for name in os.listdir(os.path.join(self.queue, "mess", str(s)))
                               if is_number(name) and int(name) not in finished)
            except OSError:
                pass
        return in_mess, sum(1 for state in latest.values() if state == states.S4)
