"""The log backend's side of qmail-send's commands (qmailctl queue ...; docs/log-queue.md "Held messages").

A message a command names is brought in flight (`active`) from its live snapshot,
found by a Locator's walk of the log (locator.py: there is no index by number),
and acted on with the backend's usual records: a hold or a release is a REPLACEMENT
with the held bit of its `sched` byte set or clear (the runners never offer a
held snapshot), a requeue a REPLACEMENT whose channels are due now, a delete a
FINISH; commit() syncs them before qmail-send answers (one fsync a batch).

Interface: Commands(state, segments, garbage, recovery, deliveries) with a LogState
(state.py), Segments (segments.py), Garbage (garbage.py), Recovery (recovery.py:
scan_new(), and a checkpoint when commands leave much garbage) and Deliveries
(deliveries.py: get() and settle() of a message in flight). Reads and writes
state.active, state.taken, state.locators, state.pending_new, state.set_aside and
state.to_clean; appends REPLACEMENTs (hold, release, requeue) and FINISHes (delete);
fsyncs the log (commit). Owns nothing.
"""
from array import array

from qmailpy.backends.log import records as R
from qmailpy.backends.base import QueueError
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.locator import Locator
from qmailpy.backends.log.state import now as _now

CHECKPOINT_GARBAGE = 2000      # superseded positions held before commit() checkpoints


class Commands:
    def __init__(self, state, segments, garbage, recovery, deliveries):
        self.state = state
        self.segments = segments
        self.garbage = garbage
        self.recovery = recovery
        self.deliveries = deliveries

    def locate(self, numbers):
        locator = Locator(self.segments, numbers)
        self.state.locators.append(locator)
        return locator

    def forget(self, locator):
        if locator in self.state.locators:
            self.state.locators.remove(locator)

    def take(self, numbers, locator=None):
        if locator is None:                      # one walk now, for these numbers alone
            locator = self.locate(array("Q", sorted(set(numbers))))
            try:
                while not locator.step():
                    pass
                return self.take(numbers, locator)
            finally:
                self.forget(locator)
        self.recovery.scan_new()
        self.state.taken = {}
        preprocessed, queued = [], []
        for n in numbers:
            pos = locator.where(n) if n not in self.state.active else None
            if pos is not None:
                self.state.taken[n] = pos
            if n in self.state.active or pos is not None:
                preprocessed.append(n)
            elif n in self.state.pending_new:
                queued.append(n)
        return preprocessed, queued

    def bring(self, n):
        """Read n's snapshot now, not at take(): a batch holds positions, not messages."""
        pos = self.state.taken.pop(n, None)
        if n in self.state.active:
            return True
        if pos is None:
            return False
        rec = self.segments.read_at(pos)
        if (rec.type not in R.SNAPSHOTS or rec.n != n or pos in self.state.garbage
                or self.segments.flagged_garbage(rec.flags, pos, rec.length)):
            return False
        a = InFlight(n, pos, rec)
        a.offered = set()
        self.state.active[n] = a
        return True

    def let_go(self, n):
        a = self.state.active.get(n)
        if a is not None:
            self.deliveries.settle(a)

    def is_held(self, n):
        a = self.state.active.get(n)
        return a is not None and a.held

    def _rewrite(self, a, held):
        was = a.held
        a.held = held
        try:
            self.garbage.write_snapshot(a)
        except QueueError:
            a.held = was
            raise

    def commit(self):
        """On disk before qmail-send answers: a power cut must not undo a hold or a delete.
        A command's batches supersede records faster than the 5-second checkpoints flag
        them: past CHECKPOINT_GARBAGE a checkpoint comes now, so the positions (and the
        bodies to clean) qmail-send holds until then stay few however long the command."""
        try:
            self.segments.writer.sync_to(*self.segments.tail())
        except OSError as e:
            raise QueueError("trouble syncing the log: %s" % e.strerror)
        if len(self.state.garbage) >= CHECKPOINT_GARBAGE:
            self.recovery.checkpoint(force=True)

    def hold(self, n):
        self._rewrite(self.deliveries.get(n), True)

    def release(self, n):
        self._rewrite(self.deliveries.get(n), False)

    def requeue(self, n, now):
        a = self.deliveries.get(n)
        for chan in a.channels.values():
            chan[0] = int(now)
        self.garbage.write_snapshot(a)

    def is_set_aside(self, n):
        return n in self.state.set_aside

    def delete_queued(self, n):
        """A FINISH superseding its ENVELOPE; the body goes at the next checkpoint, as
        for delete() (recovery drops a pending ENVELOPE that a FINISH supersedes)."""
        pos = self.state.pending_new.get(n)
        if pos is None:
            raise QueueError("message %d is not queued" % n)
        self.segments.append(R.encode_finish(_now(), n, pos))
        del self.state.pending_new[n]
        self.state.set_aside.pop(n, None)
        self.garbage.supersede(pos)
        self.state.to_clean.append(n)

    def delete(self, n):
        a = self.deliveries.get(n)
        self.segments.append(R.encode_finish(_now(), n, a.snap))
        del self.state.active[n]
        self.garbage.supersede(a.snap)
        self.state.to_clean.append(n)
