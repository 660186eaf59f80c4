"""Garbage in the log backend: live-record counts per segment and segment deletion.

A superseded record's position goes into self.garbage; its flag byte is written in
place only at a checkpoint, after the head is fsync'd (a flag must never reach the
disk before the record that supersedes it: log/recovery.py). A segment with no live
record left, older than every position still needed, is unlinked, once the removals
of the bodies finished before it are durable.
"""
import os

from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import segment_name
from qmailpy.fileio import fsync_dir


class LogGarbage:
    """Mixin of LogQueue: needs self.live, self.garbage, self.active, self.pending_new,
    self.removed_unsynced (the n mod 23 of bodies removed, their directory not yet synced)."""

    def _count(self, pos, delta):
        seg = pos[0]
        self.live[seg] = self.live.get(seg, 0) + delta

    def _supersede(self, old_pos):
        if old_pos != R.NOWHERE:
            self._count(old_pos, -1)
            self.garbage.add(old_pos)

    def _pinned_from(self, replay):
        # Runners need no pin: a cursor in a deleted segment moves to the next one.
        pins = [replay, self._tail()]
        for a in self.active.values():
            pins.append(a.snap)
            if a.delta_start:
                pins.append(a.delta_start)
        pins.extend(self.pending_new.values())
        return min(p[0] for p in pins)

    def _bodies_removed_durably(self):
        """fsync the mess/S/ directories of the bodies removed since the last time: a
        segment may hold the FINISH of such a body, and once it is deleted a body that a
        power cut brought back would be nobody's (listed by qmail-qread, a reader
        taking its garbage snapshot for its state, until the 36-hour cleanup). False
        when that is not done yet."""
        for split in sorted(self.removed_unsynced):
            try:
                fsync_dir(os.path.join(self.queue, "mess", str(split)))
            except OSError:
                return False
            self.removed_unsynced.discard(split)
        return True

    def _delete_garbage_segments(self, replay):
        pinned = self._pinned_from(replay)
        for seg in self._segments():
            if seg >= pinned:
                break
            if self.live.get(seg, 0) <= 0:
                if not self._bodies_removed_durably():
                    return
                fd = self._fds.pop(seg, None)
                if fd is not None:
                    os.close(fd)
                self.writer.forget_segment(seg)
                try:
                    os.unlink(os.path.join(self.logdir, segment_name(seg)))
                except OSError:
                    continue
                self.live.pop(seg, None)

