"""Damaged segments in the log backend: bringing back the messages they stranded
(docs/log-queue.md "Damage").

A superseded ENVELOPE or snapshot is flagged garbage in place once the record that
superseded it is on disk. If damage later destroys that newer record, the message's
last readable state is a record flagged garbage: no runner offers it, although its
body and its recipients are still there. When qmail-send finds a damaged stretch
(a corrupt record, or a torn one that is not a crashed append), it reads the whole
log once and writes each such message's last readable state again at the head: a
copy of its ENVELOPE, or a REPLACEMENT of its snapshot with the DELIVERY and
BOUNCE-NOTE records read after it folded in and every channel due now. A recipient
may be delivered twice; none is stranded. Each restored message is logged
(logline.state_restored). A quarantined stretch is named in quarantine/restored
once its messages are restored, so a restart does not read the whole log again.

Interface: DamageRestorer(state, segments, garbage, readers) with a LogState
(state.py), Segments (segments.py), Garbage (garbage.py) and Readers (readers.py,
whose scan() reads the whole log). restore() takes state.damage, reads
state.active, state.pending_new and state.new_cursor, appends the restored records,
wakes state.runners[0], writes quarantine/restored and logs each message through
state.log. The functions restorable(), stranded() and quarantined() read only what
they are given and the files they name. Owns nothing.
"""
import os

from qmailpy import logline, trigger
from qmailpy.backends.log import records as R
from qmailpy.backends.base import QueueError
from qmailpy.backends.log.segments import QUARANTINE
from qmailpy.backends.log.state import now as _now
from qmailpy.layout import relpath

RESTORED = "restored"


def restorable(queue, rec):
    """True when the body of rec's message is still in mess/ (the same size, for a snapshot):
    a message whose FINISH was lost too has had its body removed."""
    try:
        size = os.stat(os.path.join(queue, relpath("mess", rec.n))).st_size
    except OSError:
        return False
    return rec.type == R.ENVELOPE or size == rec.size


def stranded(records):
    """{n: (record, deltas)} of the messages whose last readable ENVELOPE, snapshot or FINISH,
    in log order, is an ENVELOPE or snapshot flagged garbage; deltas are the DELIVERY and
    BOUNCE-NOTE records read after it."""
    last = {}
    for rec in records:
        if rec.type == R.ENVELOPE or rec.type in R.SNAPSHOTS or rec.type == R.FINISH:
            last[rec.n] = (rec, [])
        elif rec.type in (R.DELIVERY, R.BOUNCE_NOTE) and rec.n in last:
            last[rec.n][1].append(rec)
    return {n: (rec, deltas) for n, (rec, deltas) in last.items()
            if rec.type != R.FINISH and rec.garbage}


def quarantined(logdir):
    """(unrestored stretches as (segment, offset), newest quarantine mtime or None)."""
    qdir = os.path.join(logdir, QUARANTINE)
    try:
        names = os.listdir(qdir)
    except FileNotFoundError:
        return [], None
    try:
        with open(os.path.join(qdir, RESTORED), "rb") as f:
            done = set(f.read().decode("ascii", "replace").split())
    except FileNotFoundError:
        done = set()
    stretches, newest = [], None
    for name in names:
        seg, dot, off = name.partition(".")
        if not (dot and seg.isdigit() and off.isdigit()):
            continue
        try:
            mtime = os.stat(os.path.join(qdir, name)).st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
        if name not in done:
            stretches.append((int(seg), int(off)))
    return sorted(stretches), newest


class DamageRestorer:
    def __init__(self, state, segments, garbage, readers):
        self.state = state
        self.segments = segments
        self.garbage = garbage
        self.readers = readers

    def restore(self):
        """Bring back every message stranded by the damage found so far (see the module)."""
        if not self.state.damage:
            return
        damage, self.state.damage = sorted(set(self.state.damage)), []
        bound = self.state.new_cursor.pos                  # _scan_new has read (and counted) up to here
        try:
            records = [r for r in self.readers.scan(report=False) if r.pos < bound]
            restored = []
            for n, (rec, deltas) in sorted(stranded(records).items()):
                if n in self.state.active or n in self.state.pending_new or not restorable(self.state.queue, rec):
                    continue
                restored.append((rec, deltas))
                pos = self.segments.append(self._restored(rec, deltas))
                if rec.type in R.SNAPSHOTS:
                    self.garbage.count(pos, 1)              # an ENVELOPE is counted when _scan_new reads it
                after = [d for d in damage if d > rec.pos] or damage[-1:]
                if self.state.log is not None:
                    self.state.log(logline.state_restored(n, rec.pos[0], rec.pos[1], *after[0]))
                if self.state.runners:
                    self.state.runners[0].wait_until(_now())   # its due() offers a restored snapshot
            self.segments.writer.sync_to(*self.segments.tail())
            if any(rec.type == R.ENVELOPE for rec, _ in restored):
                trigger.pull(self.state.queue)                 # qmail-send's todo scan reads an ENVELOPE
            self._mark_restored(damage)
        except (OSError, QueueError) as e:
            # the next checkpoint tries again; a record restored twice only repeats a delivery
            self.state.damage = damage + self.state.damage
            self.state.warn("trouble restoring messages after log damage: %s" % e)

    @staticmethod
    def _restored(rec, deltas):
        f = rec.fields
        if rec.type == R.ENVELOPE:
            return R.encode_envelope(_now(), rec.n, f["uid"], f["qp"], f["sender"], f["recipients"])
        now = _now()
        channels = {c: (min(due, now), [list(r) for r in rcpts])
                    for c, (due, rcpts) in f["channels"].items()}
        notes = f["notes"]
        for d in deltas:
            if d.type == R.DELIVERY and d.channel in channels and d.index < len(channels[d.channel][1]):
                channels[d.channel][1][d.index][0] = True
            elif d.type == R.BOUNCE_NOTE:
                notes = b"" if d.op == R.NOTE_CLEAR else notes + d.note
        return R.encode_snapshot(R.REPLACEMENT, now, rec.n, R.NOWHERE, f["birth"], f["qp"], f["uid"],
                                 f["size"], f["sender"], notes, (),
                                 {c: (due, [tuple(r) for r in rcpts]) for c, (due, rcpts) in channels.items()})

    def _mark_restored(self, damage):
        qdir = os.path.join(self.state.logdir, QUARANTINE)
        names = set("%d.%d" % d for d in damage)
        try:
            with open(os.path.join(qdir, RESTORED), "rb") as f:
                names |= set(f.read().decode("ascii", "replace").split())
        except FileNotFoundError:
            pass
        names = sorted(n for n in names if os.path.exists(os.path.join(qdir, n)))
        if not names:
            return
        tmp = os.path.join(qdir, RESTORED + ".tmp")
        with open(tmp, "w") as f:
            f.write("".join(n + "\n" for n in names))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(qdir, RESTORED))
