"""Garbage in the log backend: what supersedes what, live-record counts per segment,
removing finished bodies and deleting empty segments.

A superseded record's position goes into state.garbage; its flag byte is written in
place only at a checkpoint, after the head is fsync'd (a flag must never reach the
disk before the record that supersedes it: recovery.py). A segment with no live
record left, older than every position still needed, is unlinked, once the removals
of the bodies finished before it are durable.

Interface: Garbage(state, segments) with a LogState (state.py) and Segments
(segments.py). Reads and writes state.live, state.garbage and state.removed_unsynced;
reads state.active and state.pending_new (the positions still needed). Appends a
message's new snapshot (write_snapshot, superseding its old one); removes bodies
(clean: through qmail-clean's foop/n, or unlinked when there is no cleaner), fsyncs
mess/S/ and unlinks segment files. Owns nothing.
"""
import os

from qmailpy.backends.base import QueueError
from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import segment_name
from qmailpy.backends.log.state import now as _now
from qmailpy.fileio import fsync_dir
from qmailpy.layout import SPLIT, relpath


class Garbage:
    def __init__(self, state, segments):
        self.state = state
        self.segments = segments

    def count(self, pos, delta):
        seg = pos[0]
        self.state.live[seg] = self.state.live.get(seg, 0) + delta

    def supersede(self, old_pos):
        if old_pos != R.NOWHERE:
            self.count(old_pos, -1)
            self.state.garbage.add(old_pos)

    def write_snapshot(self, a, type=R.REPLACEMENT, ended=(), now=None):
        """Append InFlight a's state as a snapshot that supersedes its last one; its position."""
        now = _now() if now is None else now
        try:
            data = R.encode_snapshot(type, now, a.n, a.snap, a.birth, a.qp, a.uid, a.size, a.sender,
                                     bytes(a.notes), ended, a.channel_state(), a.held)
        except R.RecordError as e:
            # beyond what qmailpy.queuelimits lets a message reach (a queue from before it):
            # the caller retries later, as after any other failed write, and lives on
            raise QueueError("unable to record message %d: %s" % (a.n, e)) from None
        pos = self.segments.append(data)
        self.supersede(a.snap)
        self.count(pos, 1)
        a.snap, a.delta_start = pos, None
        return pos

    def clean(self, n):
        """Remove message n's body: foop/n to qmail-clean, or an unlink without one."""
        state = self.state
        state.removed_unsynced.add(n % SPLIT)
        foop = "foop/%d" % n
        if state.cleaner is not None:
            if state.cleaner.request(foop) != b"+":
                state.warn("qmail-clean unable to clean up %s" % foop)
            return
        try:
            os.unlink(os.path.join(state.queue, relpath("mess", n)))
        except FileNotFoundError:
            pass
        except OSError:
            state.warn("qmail-clean unable to clean up %s" % foop)

    def _pinned_from(self, replay):
        # Runners need no pin: a cursor in a deleted segment moves to the next one.
        pins = [replay, self.segments.tail()]
        for a in self.state.active.values():
            pins.append(a.snap)
            if a.delta_start:
                pins.append(a.delta_start)
        pins.extend(self.state.pending_new.values())
        return min(p[0] for p in pins)

    def _bodies_removed_durably(self):
        """fsync the mess/S/ directories of the bodies removed since the last time: a
        segment may hold the FINISH of such a body, and once it is deleted a body that a
        power cut brought back would be nobody's (listed by qmail-qread, a reader
        taking its garbage snapshot for its state, until the 36-hour cleanup). False
        when that is not done yet."""
        removed = self.state.removed_unsynced
        for split in sorted(removed):
            try:
                fsync_dir(os.path.join(self.state.queue, "mess", str(split)))
            except OSError:
                return False
            removed.discard(split)
        return True

    def delete_garbage_segments(self, replay):
        """Unlink the segments before every needed position that hold nothing live."""
        live = self.state.live
        pinned = self._pinned_from(replay)
        for seg in self.segments.segments():
            if seg >= pinned:
                break
            if live.get(seg, 0) <= 0:
                if not self._bodies_removed_durably():
                    return
                self.segments.forget(seg)
                try:
                    os.unlink(os.path.join(self.state.logdir, segment_name(seg)))
                except OSError:
                    continue
                live.pop(seg, None)
