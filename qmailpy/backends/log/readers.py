"""Readers of the log backend: qmail-qread, qmail-qstat, snapshots, conversion, and
the 36-hour cleanup. Each reads the whole log (scan()); qmail-send's own work never does.

Interface: Readers(state, segments) with a LogState (state.py) and Segments
(segments.py). Reads the segments, queue/log/checkpoint, queue/log/counts,
quarantine/ and mess/; of the state only logdir, queue, active and pending_new (the
cleanup spares messages in memory). Writes nothing: damage met while reading is
warned about (scan) or skipped (stream_states, current_counts), never quarantined.
Owns nothing.
"""
import os

from qmailpy import states
from qmailpy.backends.log import counts as logcounts, records as R
from qmailpy.backends.base import MessageView
from qmailpy.backends.log.damage import quarantined, restorable
from qmailpy.backends.log.recovery import read_checkpoint
from qmailpy.envelope import ChannelRecord
from qmailpy.layout import CHANNELS, SPLIT, is_number
from qmailpy.states import LEFTOVER_AGE


class Readers:
    def __init__(self, state, segments):
        self.state = state
        self.segments = segments

    def stale_messages(self, now):
        """mess/ files older than 36 h that no live record names.

        None while a quarantined stretch waits for its messages to be restored; after
        that, none that already existed when the newest stretch was quarantined: such
        a body may be a message whose every record was destroyed, kept for the
        operator until the files in quarantine/ are removed."""
        unrestored, damaged_at = quarantined(self.state.logdir)
        if unrestored:
            self.state.warn("log has quarantined records not yet restored; stale message cleanup skipped")
            return
        candidates = set()
        for s in range(SPLIT):
            d = os.path.join(self.state.queue, "mess", str(s))
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
                    if now > st.st_atime + LEFTOVER_AGE and (
                            damaged_at is None or st.st_mtime > damaged_at):
                        candidates.add(int(name))
        if not candidates:
            return
        candidates -= set(self.state.active) | set(self.state.pending_new)
        for rec in self.scan():
            if not rec.garbage and rec.type in (R.ENVELOPE,) + R.SNAPSHOTS:
                candidates.discard(rec.n)
        yield from sorted(candidates)


    def scan(self, report=True):
        """Every record of every segment, in log order (readers and conversion)."""
        for seg in self.segments.segments():
            fd = self.segments.segment_fd(seg)
            if fd is None:
                continue
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            try:
                R.parse_segment_header(data)
            except R.RecordError:
                continue
            head = seg == self.segments.head_segment()
            records, problems, _ = R.decode(data, seg, final=not head)
            if report:
                for p in problems:
                    self.state.warn(p.describe())
            yield from records

    def latest_states(self):
        """{n: [state, record fields...]} of every message in the log (a reader's full scan)."""
        msgs = {}
        for rec in self.scan():
            _fold(msgs, rec)
        # A newest record flagged garbage lost its successor: to damage (qmail-send
        # restores it) or, with the body gone too, to a FINISH in a deleted segment.
        return {n: m for n, m in msgs.items() if not m["rec"].garbage or restorable(self.state.queue, m["rec"])}

    def stream_states(self):
        """(record, done, notes) of every message in the log, newest ENVELOPE or snapshot
        first-class, in memory bounded by the work since the last checkpoint, not by the
        queue (`qmailctl queue list`; docs/log-queue.md "Reading the queue while it runs").

        done is {(channel, index)} of the DELIVERY records after a snapshot, notes its
        bounce notes. Before the checkpoint's replay position every superseded record is
        flagged garbage, so there a live ENVELOPE or snapshot is a message's newest state,
        unless a record of the same number follows the replay position (or the message
        was in flight, its deltas before it): those messages alone are folded in memory,
        as latest_states() folds all. Not a point-in-time view: a message whose state
        changes while the log is read may be missed or shown in its older state.
        """
        from qmailpy.backends.log.cursor import Cursor
        segments = self.segments.segments()
        if not segments or not os.path.exists(os.path.join(self.state.logdir, "commit")):
            return
        first = (segments[0], R.HEADER_SIZE)
        cp = read_checkpoint(self.state.logdir, self.state.warn)
        touched, start = set(), first
        if cp is not None:
            start = tuple(cp["replay"])
            for n, (_, delta, _) in cp["active"].items():
                touched.add(int(n))
                if delta:
                    start = min(start, tuple(delta))
        reader = _QuietReader(self.segments)
        cur = Cursor(reader, start)
        while True:
            head = cur.peek_schedule()
            if head is None:
                break
            if head[0] != R.ENVELOPE:
                touched.add(head[3])
            cur.skip(head[5])
        end = cur.pos
        folded = {}
        cur = Cursor(reader, first)
        while cur.pos < end:
            head = cur.peek_schedule()
            if head is None:
                break
            type, flags, _, n, _, length = head
            if n in touched:
                rec = cur.decode_here()
                if rec is not None:
                    _fold(folded, rec)
            elif flags != R.GARBAGE and (type == R.ENVELOPE or type in R.SNAPSHOTS):
                rec = cur.decode_here()
                if rec is not None:
                    yield rec, set(), rec.notes if type in R.SNAPSHOTS else b""
            cur.skip(length)
        for n, m in folded.items():
            if not m["rec"].garbage or restorable(self.state.queue, m["rec"]):
                yield m["rec"], set(m["done"]), m["notes"]

    def current_counts(self):
        """logcounts.Counts of the whole log now: qmail-send's last counts file plus the
        records after it; None when there is no usable file (count with stream_states())."""
        from qmailpy.backends.log.cursor import Cursor
        if not self.segments.segments() or not os.path.exists(os.path.join(self.state.logdir, "commit")):
            return logcounts.Counts(pos=(0, R.HEADER_SIZE))
        counts = logcounts.read(self.state.logdir)
        if counts is None:
            return None
        cur = Cursor(_QuietReader(self.segments), counts.pos)
        logcounts.count_from(cur, counts, self.segments.read_at)
        counts.pos = cur.pos
        return counts

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
            state = states.HELD if rec.fields.get("held") else states.S5
            views.append(MessageView(n, state, rec.birth, rec.size, rec.sender,
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
                in_mess += sum(1 for name in os.listdir(os.path.join(self.state.queue, "mess", str(s)))
                               if is_number(name) and int(name) not in finished)
            except OSError:
                pass
        return in_mess, sum(1 for state in latest.values() if state == states.S4)


def _fold(msgs, rec):
    """Apply one record to {n: {state, rec, done, notes}}: a message's newest state."""
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


class _QuietReader:
    """What a Cursor needs of Segments, for a reader: damage is skipped, not
    reported or quarantined (qmail-send does that when it meets it)."""

    def __init__(self, segments):
        self.segments = segments
        self.writer = segments.writer

    def segment_fd(self, seg):
        return self.segments.segment_fd(seg)

    def next_segment(self, seg):
        return self.segments.next_segment(seg)

    def problem(self, problem, data):
        pass
