"""Finding due work in the log backend without an index: the queue runners.

Each runner is a cursor that walks the log a fixed lag behind the head
(RUNNER_LAGS). A runner meeting a live snapshot whose next attempt is due offers
it; one not due yet is left to the slowest runner that will still meet it before
it is due; the runner that owns it remembers (due, position) in a heap and walks
on, so a record written later but due sooner is not held up behind it. The heap
is bounded (RUNNER_HELD); a full heap makes the runner wait at the record instead.
A runner's restart position is the oldest of its cursor and its heap, so nothing
it passed is lost in a crash. Deferred messages move to the head with each
REPLACEMENT, so old segments empty.

SIGALRM's run_all_now() is a separate sweep (the flusher) from the oldest segment
to the tail, offering at most FLUSH_IN_FLIGHT messages at a time.

Interface: Runners(state, segments, recovery) with a LogState (state.py), Segments
(segments.py) and Recovery (recovery.py: recover() before the first walk, a
checkpoint() after each due(), ended_without_body() for an offered message whose
body is gone). Reads the log through state.runners' cursors and state.flusher;
reads state.garbage; puts what it offers in flight (state.active). Appends nothing
itself. Owns nothing.
"""
import heapq

from qmailpy.backends.log import records as R
from qmailpy.backends.base import QueueError, Scheduled
from qmailpy.backends.log.cursor import Cursor
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.recovery import CHECKPOINT_EVERY
from qmailpy.backends.log.state import now as _now

# Runner lags (seconds behind the head). qmail's retry intervals run from 100 s
# to about 9 h; a deferred message is met no earlier than it is due and at most
# one lag step late.
RUNNER_LAGS = (0, 60, 300, 900, 2700, 7200, 21600)
RUNNER_BATCH = 2000           # records one runner looks at per due() call
RUNNER_HELD = 4096            # not-yet-due snapshots one runner remembers having passed
FLUSH_IN_FLIGHT = 1000        # run_all_now(): messages offered at once


class Runners:
    def __init__(self, state, segments, recovery):
        self.state = state
        self.segments = segments
        self.recovery = recovery

    def due(self, now=None):
        """Scheduled entries the runners found due (channel None = completion)."""
        now = _now() if now is None else now
        if not self.state.recovered:
            self.recovery.recover()
        found = []
        tail = self.segments.tail()                      # one read of the commit word, not one per runner
        for i, r in enumerate(self.state.runners):
            if r.idle(now, tail):
                continue
            slower = self.state.runner_lags[i + 1] if i + 1 < len(self.state.runners) else None
            self._walk(r, slower, now, found)
        if self.state.flusher is not None:
            self._flush(now, found)
        self.recovery.checkpoint(now=now)
        return found

    def _walk(self, r, slower, now, found):
        self._offer_held(r, now, found)
        cur = r.cursor
        r.wake = r.held[0][0] if r.held else 0
        r.parked = False
        garbage, active = self.state.garbage, self.state.active
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
                    and not self.segments.flagged_garbage(flags, cur.pos, length)):
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
            if pos in self.state.garbage:
                continue
            try:
                rec = self.segments.read_at(pos)
            except QueueError:
                continue                         # its segment is gone: it was garbage
            if (rec.type not in R.SNAPSHOTS or rec.n in self.state.active or rec.held
                    or self.segments.flagged_garbage(rec.flags, pos, rec.length)):
                continue
            ready = [c for c, (due, _) in rec.channels.items() if due <= now]
            self._offer(rec, ready or [None], now, found)

    def run_all_now(self):
        """SIGALRM (docs/qmail-send.md "Signals"): offer every queued channel now, whatever its schedule.

        A sweep from the oldest segment to the present tail, offering at most
        FLUSH_IN_FLIGHT messages at a time so memory stays bounded. A signal that
        arrives during a sweep does not restart it (signals faster than a sweep of
        a large log would then never let it reach the later messages): it asks
        for one more sweep once this one ends."""
        if self.state.flusher is not None:
            self.state.flush_again = True
            return
        segments = self.segments.segments()
        if segments:
            self.state.flusher = (Cursor(self.segments, (segments[0], R.HEADER_SIZE)), self.segments.tail())

    def _flush_done(self):
        self.state.flusher = None
        if self.state.flush_again:
            self.state.flush_again = False
            self.run_all_now()

    def _flush(self, now, found):
        cur, stop = self.state.flusher
        for _ in range(RUNNER_BATCH):
            if len(self.state.active) >= FLUSH_IN_FLIGHT:
                return
            if cur.pos >= stop:
                self._flush_done()
                return
            head = cur.peek_schedule()
            if head is None:
                self._flush_done()
                return
            type, flags, _, n, dues, length = head
            if (dues is not None and n not in self.state.active and cur.pos not in self.state.garbage
                    and not self.segments.flagged_garbage(flags, cur.pos, length)):
                rec = cur.peek()
                if rec is None:
                    return
                self._offer(rec, list(dues) or [None], now, found, at=now)
            cur.skip(length)

    def _offer(self, rec, channels, now, found, at=None):
        if self.recovery.ended_without_body(rec.n, rec.pos):
            return
        a = InFlight(rec.n, rec.pos, rec)
        a.offered = set(channels)
        self.state.active[rec.n] = a
        for c in channels:
            found.append(Scheduled(rec.n, c, now if c is None or at is not None else a.channels[c][0]))

    def next_wakeup(self):
        """Epoch second when due() may find more (None: nothing pending)."""
        wakes = [r.wake for r in self.state.runners if r.wake]
        if self.state.flusher is not None:
            wakes.append(0)
        state = self.state
        if state.garbage or state.active or state.to_clean or state.replayed_clean or state.damage:
            wakes.append(state.last_checkpoint + CHECKPOINT_EVERY)
        return min(wakes) if wakes else None
