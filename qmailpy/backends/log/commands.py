"""The log backend's side of qmail-send's commands (qmailctl queue ...; docs/log-queue.md "Held messages").

A message a command names is brought in flight (`active`) from its live snapshot,
found by a Locator's walk of the log (log/locator.py: there is no index by number),
and acted on with the backend's usual records: a hold or a release is a REPLACEMENT
with the held bit of its `sched` byte set or clear (the runners never offer a
held snapshot), a requeue a REPLACEMENT whose channels are due now, a delete a
FINISH; commit() syncs them before qmail-send answers (one fsync a batch).
"""
from array import array

from qmailpy.backends.log import records as R
from qmailpy.backends.base import QueueError
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.locator import Locator
from qmailpy.backends.log.segments import now as _now

CHECKPOINT_GARBAGE = 2000      # superseded positions held before commit() checkpoints


class LogCommands:
    """Mixin of LogQueue: needs active, taken, locators, pending_new, garbage, writer, _segments(),
    _read_at(), _scan_new(), _get(), _settle(), _write_snapshot(), _append(), _supersede() and _tail()."""

    def locate(self, numbers):
        locator = Locator(self, numbers)
        self.locators.append(locator)
        return locator

    def forget(self, locator):
        if locator in self.locators:
            self.locators.remove(locator)

    def _note_appended(self, data, pos):
        """Each record qmail-send appends, for the locators (log/locator.py)."""
        off = 0
        while off < len(data):
            length = R.frame_length(data, off)
            if length is None:
                return
            head = R.schedule(data, off)
            for locator in self.locators:
                locator.note(head[0], head[3], (pos[0], pos[1] + off))
            off += length

    def take(self, numbers, locator=None):
        if locator is None:                      # one walk now, for these numbers alone
            locator = self.locate(array("Q", sorted(set(numbers))))
            try:
                while not locator.step():
                    pass
                return self.take(numbers, locator)
            finally:
                self.forget(locator)
        self._scan_new()
        self.taken = {}
        preprocessed, queued = [], []
        for n in numbers:
            pos = locator.where(n) if n not in self.active else None
            if pos is not None:
                self.taken[n] = pos
            if n in self.active or pos is not None:
                preprocessed.append(n)
            elif n in self.pending_new:
                queued.append(n)
        return preprocessed, queued

    def bring(self, n):
        """Read n's snapshot now, not at take(): a batch holds positions, not messages."""
        pos = self.taken.pop(n, None)
        if n in self.active:
            return True
        if pos is None:
            return False
        rec = self._read_at(pos)
        if (rec.type not in R.SNAPSHOTS or rec.n != n or pos in self.garbage
                or self._flagged_garbage(rec.flags, pos, rec.length)):
            return False
        a = InFlight(n, pos, rec)
        a.offered = set()
        self.active[n] = a
        return True

    def let_go(self, n):
        a = self.active.get(n)
        if a is not None:
            self._settle(a)

    def is_held(self, n):
        a = self.active.get(n)
        return a is not None and a.held

    def _rewrite(self, a, held):
        was = a.held
        a.held = held
        try:
            self._write_snapshot(a)
        except QueueError:
            a.held = was
            raise

    def commit(self):
        """On disk before qmail-send answers: a power cut must not undo a hold or a delete.
        A command's batches supersede records faster than the 5-second checkpoints flag
        them: past CHECKPOINT_GARBAGE a checkpoint comes now, so the positions (and the
        bodies to clean) qmail-send holds until then stay few however long the command."""
        try:
            self.writer.sync_to(*self._tail())
        except OSError as e:
            raise QueueError("trouble syncing the log: %s" % e.strerror)
        if len(self.garbage) >= CHECKPOINT_GARBAGE:
            self.checkpoint(force=True)

    def hold(self, n):
        self._rewrite(self._get(n), True)

    def release(self, n):
        self._rewrite(self._get(n), False)

    def requeue(self, n, now):
        a = self._get(n)
        for chan in a.channels.values():
            chan[0] = int(now)
        self._write_snapshot(a)

    def is_set_aside(self, n):
        return n in self.set_aside

    def delete_queued(self, n):
        """A FINISH superseding its ENVELOPE; the body goes at the next checkpoint, as
        for delete() (recovery drops a pending ENVELOPE that a FINISH supersedes)."""
        pos = self.pending_new.get(n)
        if pos is None:
            raise QueueError("message %d is not queued" % n)
        self._append(R.encode_finish(_now(), n, pos))
        del self.pending_new[n]
        self.set_aside.pop(n, None)
        self._supersede(pos)
        self.to_clean.append(n)

    def delete(self, n):
        a = self._get(n)
        self._append(R.encode_finish(_now(), n, a.snap))
        del self.active[n]
        self._supersede(a.snap)
        self.to_clean.append(n)
