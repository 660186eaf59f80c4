"""Checkpoints and recovery of the log backend.

Durability: ENVELOPE (qmail-queue) and DELIVERY records are fsync'd before
success is reported, shared between processes (group commit, commit.py).
Everything else is bookkeeping. Every CHECKPOINT_EVERY seconds: fsync the head;
only then write the garbage flags of records superseded since the last checkpoint,
fsync the segments that got flags, and write queue/log/checkpoint (the restart
positions): the replay position, the runners' positions, live-record counts per
segment, the ENVELOPEs not yet preprocessed and the messages in flight. Only after
it is renamed into place and log/ fsync'd are finished messages' bodies removed and
all-garbage segments deleted (garbage.py): before, a power cut could keep such an
unlink with the old checkpoint, which still lists a message in flight whose FINISH
was in the unlinked segment.

Recovery (startup) reads the checkpoint and only the working suffix: from the
replay position, or from the first delta of a message in flight if earlier. A
torn tail is cut off and reported; a corrupt record in the middle is copied to
queue/log/quarantine/ and reported. Passes that were in flight (START without a
REPLACEMENT or FINISH) are reconciled: a REPLACEMENT with their remaining
recipients due now, unless the body is gone (ended_without_body). It never reads
the rest of the queue.

Interface: Recovery(state, segments, garbage, newwork, restorer) with a LogState
(state.py), Segments (segments.py), Garbage (garbage.py), NewWork (newwork.py) and
a DamageRestorer (damage.py). recover() rebuilds every field of the state from
queue/log/checkpoint, queue/log/counts and the working suffix, and sets up
state.new_cursor and state.runners; checkpoint() writes the garbage flags, the
counts file and queue/log/checkpoint (atomically), then removes the bodies in
state.to_clean and state.replayed_clean and the all-garbage segments. Appends
REPLACEMENTs (reconciled passes) and FINISHes (ended_without_body). Owns nothing.
"""
import fcntl
import json
import os

from qmailpy import logline
from qmailpy.backends.log import counts as logcounts, records as R
from qmailpy.backends.base import CleanerLost, QueueError
from qmailpy.backends.log.commit import fsync_dir
from qmailpy.backends.log.cursor import Cursor, Runner
from qmailpy.backends.log.damage import quarantined
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.state import now as _now
from qmailpy.fileio import create_fresh, write_all
from qmailpy.layout import relpath

CHECKPOINT_EVERY = 5
CHECKPOINT = "checkpoint"


def read_checkpoint(logdir, warn):
    """The checkpoint's fields, or None when there is none (or it is damaged: warned)."""
    try:
        with open(os.path.join(logdir, CHECKPOINT), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        body, crc = data.rsplit(b"\n", 1)[0].rsplit(b" ", 1)
        if int(crc) != R.crc32c(body):
            raise ValueError("checksum")
        return json.loads(body)
    except ValueError:
        warn("log checkpoint is damaged; scanning the whole log")
        return None


class Recovery:
    def __init__(self, state, segments, garbage, newwork, restorer):
        self.state = state
        self.segments = segments
        self.garbage = garbage
        self.newwork = newwork
        self.restorer = restorer

    def scan_new(self):
        """Read the new work appended since last time (recovering first if not yet done)."""
        if self.state.new_cursor is None:
            self.recover()
        self.newwork.scan()

    def recover(self):
        """Rebuild the in-memory state from the checkpoint and the working suffix."""
        segments = self.segments.segments()
        cp = read_checkpoint(self.state.logdir, self.state.warn)
        first = (segments[0], R.HEADER_SIZE) if segments else (0, R.HEADER_SIZE)
        if cp is None:
            replay = first
            self.state.live, self.state.pending_new = {}, {}
            self.state.replayed_clean = []
            runner_pos = [first] * len(self.state.runner_lags)
            carried = {}
        else:
            replay = tuple(cp["replay"])
            self.state.live = {int(k): v for k, v in cp["counts"].items()}
            self.state.pending_new = {int(k): tuple(v) for k, v in cp["pending"].items()}
            saved = [tuple(p) for p in cp["runners"]]
            runner_pos = (saved + [replay] * len(self.state.runner_lags))[:len(self.state.runner_lags)]
            carried = {int(k): (tuple(v[0]), tuple(v[1]) if v[1] else None, v[2])
                       for k, v in cp["active"].items()}
            self.state.replayed_clean = list(cp.get("clean", ()))
        start = min([replay] + [d for _, d, _ in carried.values() if d])
        self.state.active = {}
        for n, (snap, _, passes) in carried.items():
            try:
                a = self._active_at(n, snap)
            except QueueError as e:
                self.state.warn("cannot reload message %d for recovery: %s" % (n, e))
                continue
            a.passes = set(passes) & set(a.channels)
        self.state.replayed_state = {}             # n -> its newest ENVELOPE or snapshot replayed
        self.state.lost_starts = {}                # n -> (lost snapshot, channels STARTed from it)
        counts = logcounts.read(self.state.logdir)
        self.state.state_counts = counts if counts is not None and counts.pos >= start else None
        with self.segments.writer.locked():
            tail = self._replay(start, replay, segments)
        if self.state.state_counts is None or self.state.state_counts.pos > tail:
            self.state.state_counts = self._recount(first, tail)
        self.state.state_counts.pos = tail
        self._reconcile()
        self.state.damage += quarantined(self.state.logdir)[0]    # found before a crash, not yet restored
        self.state.new_cursor = Cursor(self.segments, tail)
        self.state.runners = [Runner(lag, Cursor(self.segments, pos))
                              for lag, pos in zip(self.state.runner_lags, runner_pos)]
        self.state.recovered = True
        self.checkpoint(force=True)


    def _recount(self, first, tail):
        """Counts of every message in the log up to tail (counts.py), read once."""
        return logcounts.count_from(Cursor(self.segments, first), logcounts.Counts(),
                                    self.segments.read_at, tail)

    def _active_at(self, n, snap):
        a = InFlight(n, snap, self.segments.read_at(snap))
        self.state.active[n] = a
        return a

    def _replay(self, start, replay, segments):
        """Apply the records from start; before `replay` only deltas of carried messages.

        Returns the tail: where the log really ends (the caller holds the append lock)."""
        tail = start
        for seg in [s for s in segments if s >= start[0]]:
            fd = self.segments.segment_fd(seg)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            try:
                R.parse_segment_header(data)
            except R.RecordError as e:
                self.state.warn("log segment %d: %s; quarantined" % (seg, e))
                self.segments.problem(R.Problem(R.CORRUPT, seg, 0, len(data)), data)
                continue
            offset = start[1] if seg == start[0] else R.HEADER_SIZE
            if offset > len(data):
                # Records the checkpoint had read are gone: damage, not a crashed append.
                lost = R.valid_end(data)
                self.segments.problem(R.Problem(R.TORN, seg, lost, offset), b"")
                offset = lost
            records, problems, end = R.decode(data, seg, offset, final=True)
            for p in problems:
                self.segments.problem(p, data[p.start:p.end])
            if seg == segments[-1]:
                # The head: cut any torn tail so appenders continue after good data.
                self.segments.writer.reset_end(seg, end)
            counts = self.state.state_counts
            for rec in records:
                self._apply(rec, rec.pos >= replay)
                if counts is not None and rec.pos >= counts.pos and logcounts.counted(rec.type):
                    counts.delta(rec, self.segments.read_at)
            tail = (seg, end)
        return tail

    def _apply(self, rec, counting):
        n, t = rec.n, rec.type
        if not counting:
            a = self.state.active.get(n)
            if a is not None and rec.pos > a.snap:
                self._apply_delta(a, rec)
            return
        if t == R.ENVELOPE:
            # Numbers are mess/ inodes: an ENVELOPE after a FINISH of the same number is
            # a new message on the inode freed by that FINISH's clean, so mess/S/n is its
            # body now and must not be cleaned for the old one.
            if n in self.state.replayed_clean:
                self.state.replayed_clean = [m for m in self.state.replayed_clean if m != n]
            self.garbage.count(rec.pos, 1)              # its PREPROCESSED, if any, follows and uncounts it
            if not self.segments.flagged_garbage(rec.flags, rec.pos, rec.length):
                self.state.pending_new[n] = rec.pos
                self.state.replayed_state[n] = rec.pos
        elif t in R.SNAPSHOTS:
            if t == R.PREPROCESSED:
                self.state.pending_new.pop(n, None)
            self.garbage.supersede(rec.prev)
            self._supersede_lost_link(n, rec.prev)
            self.state.replayed_state[n] = rec.pos
            self.garbage.count(rec.pos, 1)
            a = self.state.active.get(n)
            lost = self.state.lost_starts.pop(n, None)
            if a is None and lost is not None and lost[0] == rec.prev:
                # the snapshot the STARTs named is lost, this one carries its recipients:
                # those passes are in flight from here, and the deltas after it apply
                a = InFlight(n, rec.prev, rec)
                a.passes = lost[1]
            if a is not None:
                keep = (a.passes - set(rec.ended)) & set(rec.channels)
                fresh = InFlight(n, rec.pos, rec)
                fresh.passes = keep
                self.state.active[n] = fresh
                if not keep:
                    del self.state.active[n]
        elif t == R.FINISH:
            self.garbage.supersede(rec.prev)
            self._supersede_lost_link(n, rec.prev)
            if self.state.pending_new.get(n) == rec.prev:
                del self.state.pending_new[n]          # a set-aside message deleted (commands.py)
            self.state.replayed_state.pop(n, None)
            self.state.active.pop(n, None)
            self.state.replayed_clean.append(n)        # the crash may have come before its unlink
        elif t == R.START:
            a = self.state.active.get(n)
            if a is None or a.snap != rec.snapshot:
                try:
                    a = self._active_at(n, rec.snapshot)
                except QueueError as e:
                    self.state.warn("START for message %d names a lost snapshot: %s" % (n, e))
                    snap, channels = self.state.lost_starts.get(n, (rec.snapshot, set()))
                    if snap != rec.snapshot:
                        channels = set()
                    self.state.lost_starts[n] = (rec.snapshot, channels | {rec.channel})
                    return
            a.passes.add(rec.channel)
        else:
            a = self.state.active.get(n)
            if a is not None:
                self._apply_delta(a, rec)

    def _supersede_lost_link(self, n, prev):
        """A record superseding `prev` supersedes n's newest state replayed before it too
        when that is not `prev`: the record between them was lost (a hole a power cut
        left among unsynced appends, or damage). Left live, that older state would be
        offered again after a FINISH had removed the body, and fail for good. An ENVELOPE
        the checkpoint lists as not yet preprocessed, before the replay, is such a state
        too: preprocessed again it would put a second copy of the message in flight beside
        the live snapshot, each delivering it (qmail-send stopped on KeyError: 'remote')."""
        older = self.state.replayed_state.get(n, self.state.pending_new.get(n))
        if older is not None and older != prev and older < prev:
            self.garbage.supersede(older)
            if self.state.pending_new.get(n) == older:
                del self.state.pending_new[n]

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
        for n, a in sorted(self.state.active.items()):
            if self.ended_without_body(n, a.snap):
                continue
            for c in a.passes:
                if c in a.channels:
                    a.channels[c][0] = min(a.channels[c][0], now)
            try:
                self.garbage.write_snapshot(a, ended=tuple(a.passes), now=now)
            except QueueError as e:
                # a full disk, or a snapshot too large for a record (a queue from before
                # qmailpy/queuelimits.py): its older snapshot stays live, and qmail-send starts
                self.state.warn(str(e))
        self.state.active = {}

    def checkpoint(self, force=False, now=None):
        now = _now() if now is None else now
        if not force and now < self.state.last_checkpoint + CHECKPOINT_EVERY:
            return
        self.state.last_checkpoint = now
        self.scan_new()
        self.restorer.restore()
        replay = self.state.new_cursor.pos
        try:
            self.segments.writer.sync_to(*replay)
        except OSError as e:
            self.state.warn("trouble fsyncing log: %s" % e.strerror)
            return
        flagged = set()
        unwritten = set()
        for pos in sorted(self.state.garbage):
            fd = self.segments.segment_fd(pos[0])
            if fd is None:
                continue
            try:
                os.pwrite(fd, bytes((R.GARBAGE,)), pos[1] + R.FLAGS_OFFSET)
                flagged.add(pos[0])
            except OSError:
                unwritten.add(pos)
        # A flag that could not be written stays owed: its position stays superseded in
        # memory, and no checkpoint moves recovery's start past a record whose flag on
        # disk still reads live (a restart would take it for live and offer it again).
        self.state.garbage.clear()
        self.state.garbage.update(unwritten)
        # Every cursor reads afresh: a buffer read before the flags were written shows the
        # records superseded since as live, and self.state.garbage no longer names them (a
        # paused SIGALRM sweep offered a finished message again, tests/test_logqueue_sweep.py).
        for r in self.state.runners:
            r.cursor.invalidate()
        self.state.new_cursor.invalidate()
        if self.state.flusher is not None:
            self.state.flusher[0].invalidate()
        cleaning = self.state.to_clean
        try:
            for seg in flagged:
                fd = self.segments.segment_fd(seg)
                if fd is not None:
                    os.fsync(fd)
            if self.state.state_counts is not None:
                self.state.state_counts.write(self.state.logdir)
            if unwritten:
                self.state.warn("trouble writing %d garbage flags; checkpoint put off" % len(unwritten))
                return
            self._write_checkpoint(replay, cleaning)
        except OSError as e:
            self.state.warn("trouble writing log checkpoint: %s" % e.strerror)
            return
        # Only now that the checkpoint no longer needs them: the bodies of finished
        # messages and the segments with nothing live. Unlinked before, a power cut could
        # keep an unlink (any later fsync commits it) with the old checkpoint, which lists
        # as in flight a message whose FINISH was in the unlinked segment.
        self.state.to_clean = []
        for i, n in enumerate(cleaning):
            try:
                self.garbage.clean(n)
            except CleanerLost:
                # qmail-send must exit (docs/qmail-send.md "Signals"); the checkpoint just
                # written names these numbers ("clean"), so a restart cleans them.
                self.state.to_clean = cleaning[i:] + self.state.to_clean
                raise
        self._clean_replayed()
        self.garbage.delete_garbage_segments(replay)

    def ended_without_body(self, n, snap):
        """True, after ending it, for message n whose snapshot at `snap` is live but whose
        body is gone: mess/S/n is removed only after a durable FINISH, so the message
        ended and its FINISH is lost (damage, or a power cut on a checkpoint before issue
        29's order). Delivered again it would fail for ever. A FINISH ends it, with a
        warning naming it (docs/log-queue.md "Recovery and checkpoints")."""
        rel = relpath("mess", n)
        try:
            os.stat(os.path.join(self.state.queue, rel))
            return False
        except FileNotFoundError:
            pass
        except OSError:
            return False                    # the delivery reports the trouble and is retried
        self.segments.append(R.encode_finish(_now(), n, snap))
        self.garbage.supersede(snap)
        if self.state.log is not None:
            self.state.log(logline.ended_without_body(n, rel))
        return True

    def _clean_replayed(self):
        """Clean the bodies of FINISHes that recovery replayed, unless reused.

        The crash may have come after such a body was unlinked, and its number (an
        inode) may then belong to a new message: one whose qmail-queue has written
        mess/S/n but not yet appended its ENVELOPE. Every qmail-queue holds a shared
        flock on queue/ for its whole run; holding it exclusively (without waiting:
        a slow submission must not stall qmail-send) means none is half way, so an
        ENVELOPE read now names every number in new use. Not possible now: the next
        checkpoint tries again."""
        if not self.state.replayed_clean:
            return
        try:
            fd = os.open(self.state.queue, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return
            self.scan_new()                     # drops the numbers that new ENVELOPEs reuse
            cleaning, self.state.replayed_clean = self.state.replayed_clean, []
            for i, n in enumerate(cleaning):
                try:
                    self.garbage.clean(n)
                except CleanerLost:
                    self.state.replayed_clean = cleaning[i:]
                    raise
        finally:
            os.close(fd)

    def _write_checkpoint(self, replay, cleaning=()):
        runners = [list(r.restart_pos()) for r in self.state.runners]
        body = json.dumps({
            "version": 1, "replay": list(replay), "runners": runners,
            "counts": {str(k): v for k, v in self.state.live.items() if v > 0},
            "pending": {str(n): list(p) for n, p in self.state.pending_new.items()},
            "active": {str(n): [list(a.snap), list(a.delta_start) if a.delta_start else None,
                                sorted(a.passes)] for n, a in self.state.active.items()},
            "clean": self.state.replayed_clean + list(cleaning),
        }, separators=(",", ":")).encode()
        data = body + b" %d\n" % R.crc32c(body)
        tmp = os.path.join(self.state.logdir, CHECKPOINT + ".tmp")
        fd = create_fresh(tmp, 0o660)
        try:
            write_all(fd, data)       # all of it, or OSError: the rename below is never reached
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self.state.logdir, CHECKPOINT))
        fsync_dir(self.state.logdir)
