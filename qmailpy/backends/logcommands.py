"""The log backend's side of qmail-send's commands (qmailctl queue ...; docs/log-queue.md "Held messages").

A message a command names is brought in flight (`active`) from its live snapshot,
found by one read of the log per command (there is no index by number), and
acted on with the backend's usual records: a hold or a release is a REPLACEMENT
with the held bit of its `sched` byte set or clear (the runners never offer a
held snapshot), a requeue a REPLACEMENT whose channels are due now, a delete a
FINISH, synced before the command is answered.
"""
from qmailpy.backends import logrecords as R
from qmailpy.backends.base import QueueError
from qmailpy.backends.logcursor import Cursor
from qmailpy.backends.loginflight import InFlight
from qmailpy.backends.logsegments import now as _now


class LogCommands:
    """Mixin of LogQueue: needs active, taken, pending_new, garbage, _segments(), _read_at(), _scan_new(),
    _get(), _settle(), _write_snapshot(), _append() and _supersede()."""

    def take(self, numbers):
        self.taken = {}
        wanted = set(numbers) - set(self.active)
        if wanted:
            self._scan_new()
            self.taken = self._live_snapshots(wanted)
        preprocessed = [n for n in numbers if n in self.active or n in self.taken]
        queued = [n for n in numbers if n in self.pending_new and n not in preprocessed]
        return preprocessed, queued

    def bring(self, n):
        """Read n's snapshot now, not at take(): a command naming 100,000 messages keeps
        100,000 positions in memory, not 100,000 messages in flight."""
        pos = self.taken.pop(n, None)
        if n in self.active:
            return True
        if pos is None:
            return False
        rec = self._read_at(pos)
        if (rec.type not in R.SNAPSHOTS or pos in self.garbage
                or self._flagged_garbage(rec.flags, pos, rec.length)):
            return False
        a = InFlight(n, pos, rec)
        a.offered = set()
        self.active[n] = a
        return True

    def _live_snapshots(self, wanted):
        """{n: position of its newest snapshot} for the wanted numbers that have one and
        no FINISH after it: one walk of the log reading only each record's fixed prefix,
        so memory holds the answer, not the log."""
        found = {}
        segments = self._segments()
        if not segments:
            return found
        cur = Cursor(self, (segments[0], R.HEADER_SIZE))
        while True:
            head = cur.peek_schedule()
            if head is None:
                return found
            type, _flags, _time, n, _dues, length = head
            if n in wanted:
                if type in R.SNAPSHOTS:
                    found[n] = cur.pos
                elif type == R.FINISH:
                    found.pop(n, None)
            cur.skip(length)

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
        try:                                     # on disk before qmail-send answers "held":
            self.writer.sync_to(*self._tail())   # a power cut must not undo it
        except OSError as e:
            raise QueueError("trouble syncing the log: %s" % e.strerror)

    def hold(self, n):
        self._rewrite(self._get(n), True)

    def release(self, n):
        self._rewrite(self._get(n), False)

    def requeue(self, n, now):
        a = self._get(n)
        for chan in a.channels.values():
            chan[0] = int(now)
        self._write_snapshot(a)

    def delete(self, n):
        a = self._get(n)
        self._append(R.encode_finish(_now(), n, a.snap), durable=True)
        del self.active[n]
        self._supersede(a.snap)
        self.to_clean.append(n)
