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
from qmailpy.backends.loginflight import InFlight
from qmailpy.backends.logsegments import now as _now


class LogCommands:
    """Mixin of LogQueue: needs active, pending_new, garbage, scan(), _scan_new(),
    _get(), _settle(), _write_snapshot(), _append() and _supersede()."""

    def take(self, numbers):
        wanted = set(numbers) - set(self.active)
        if wanted:
            self._scan_new()
            found = {}
            for rec in self.scan(report=False):
                if rec.n not in wanted:
                    continue
                if rec.type in R.SNAPSHOTS:
                    found[rec.n] = rec
                elif rec.type == R.FINISH:
                    found.pop(rec.n, None)
            for n, rec in found.items():
                if rec.garbage or rec.pos in self.garbage or n in self.active:
                    continue
                a = InFlight(n, rec.pos, rec)
                a.offered = set()
                self.active[n] = a
        preprocessed = [n for n in numbers if n in self.active]
        queued = [n for n in numbers if n in self.pending_new and n not in self.active]
        return preprocessed, queued

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
