"""Deliveries and completion on the log backend: what qmail-send reads and appends for
a message in flight (docs/log-queue.md).

Interface: Deliveries(state, segments, garbage, recovery) with a LogState (state.py),
Segments (segments.py), Garbage (garbage.py) and Recovery (recovery.py, whose
checkpoint() save_schedule() forces at exit). Reads and writes the messages in flight
(state.active, InFlight objects) and state.results_unsynced; appends START, DELIVERY,
BOUNCE-NOTE and FINISH records and REPLACEMENT snapshots; a finished message's body is
queued in state.to_clean (removed after the next checkpoint). Owns nothing.
"""
from qmailpy.backends.base import CleanerLost, QueueError
from qmailpy.backends.log import records as R
from qmailpy.backends.log.state import now as _now
from qmailpy.envelope import ChannelRecord
from qmailpy.layout import CHANNELS, SPLIT


def channel_file(n, channel):
    """How log lines name a channel of message n (base.QueueBackend.channel_file)."""
    return "%s/%d/%d" % (channel, n % SPLIT, n)


class Deliveries:
    def __init__(self, state, segments, garbage, recovery):
        self.state = state
        self.segments = segments
        self.garbage = garbage
        self.recovery = recovery

    def get(self, n):
        """Message n in flight; QueueError when it is not."""
        a = self.state.active.get(n)
        if a is None:
            raise QueueError("message %d is not in flight" % n)
        return a

    def info(self, n):
        a = self.get(n)
        return a.sender, a.birth

    def recipients(self, n, channel):
        a = self.state.active.get(n)
        if a is None or channel not in a.channels:
            raise QueueError("trouble opening %s; will try again later" % channel_file(n, channel))
        if channel not in a.passes:
            pos = self.segments.append(R.encode_start(_now(), n, a.snap, channel))
            a.passes.add(channel)
            a.offered.add(channel)
            if a.delta_start is None:
                a.delta_start = pos
        return [ChannelRecord(i, bool(done), addr) for i, (done, addr) in enumerate(a.channels[channel][1])]

    def mark_done(self, n, channel, record):
        a = self.get(n)
        result = R.FAILURE if a.failed else R.SUCCESS
        # durable at sync_results(), once per batch of reports (qmail-send's group commit)
        pos = self.segments.append(R.encode_delivery(_now(), n, channel, record.offset, result))
        self.state.results_unsynced = True
        if a.delta_start is None:
            a.delta_start = pos
        a.channels[channel][1][record.offset][0] = True
        a.failed = False
        record.done = True

    def sync_results(self):
        if not self.state.results_unsynced:
            return
        try:
            self.segments.writer.sync_all()
        except OSError as e:
            raise QueueError("trouble syncing the log: %s" % e.strerror)
        self.state.results_unsynced = False

    def add_bounce_note(self, n, note):
        # Durable before the DELIVERY that marks the recipient done: a disk that kept
        # the DELIVERY and lost the note (unsynced writes in any order) ends the
        # message without its bounce. Failures are rare; the fsync is cheap here.
        a = self.get(n)
        pos = self.segments.append(R.encode_bounce_note(_now(), n, R.NOTE_ADD, note), durable=True)
        if a.delta_start is None:
            a.delta_start = pos
        a.notes += note
        a.failed = True

    def settle(self, a):
        """Out of flight once nothing of it is offered or being delivered."""
        if not a.offered and not a.passes:
            del self.state.active[a.n]

    def finish_channel(self, n, channel):
        a = self.get(n)
        state = a.channels.pop(channel, None)
        try:
            self.garbage.write_snapshot(a, ended=(channel,))
        except QueueError:
            # Not written (a full disk): the channel stays as it was, so the retry
            # qmail-send schedules opens it again instead of finding nothing to open.
            if state is not None:
                a.channels[channel] = state
            raise
        a.passes.discard(channel)
        a.offered.discard(channel)
        if not a.channels:
            a.offered.add(None)                  # qmail-send schedules completion next
        left = [c for c in CHANNELS if c in a.channels]
        self.settle(a)                          # out of flight if the others wait for a retry
        return left

    def reschedule(self, n, channel, when):
        """Write the REPLACEMENT: the runners offer it again at `when`."""
        a = self.get(n)
        if channel in a.channels:
            a.channels[channel][0] = int(when)
        a.passes.discard(channel)
        self.garbage.write_snapshot(a, ended=(channel,))
        a.offered.discard(channel)
        self.settle(a)

    def channels_left(self, n):
        return [c for c in CHANNELS if c in self.get(n).channels]

    def completion_due(self, n):
        a = self.state.active.get(n)
        return a is not None and not a.channels

    def bounce_notes(self, n):
        a = self.get(n)
        return bytes(a.notes) if a.notes else None

    def drop_bounce_notes(self, n):
        """The bounce is queued: a fresh snapshot without the notes replaces the old one.

        (A bare NOTE_CLEAR after the message's last snapshot is not replayed for a
        message that is no longer in flight, so a crash before FINISH would send
        the bounce again.)"""
        a = self.get(n)
        a.notes = bytearray()
        self.garbage.write_snapshot(a)

    def complete(self, n):
        """FINISH now; the mess file goes at the next checkpoint, once FINISH is on disk.

        (Unlinking it first could leave, after a power cut, a live message whose body
        is gone.) A number that is not in flight is a stale leftover: cleaned at once."""
        a = self.state.active.pop(n, None)
        if a is None:
            self.garbage.clean(n)
            return
        self.segments.append(R.encode_finish(_now(), n, a.snap))
        self.garbage.supersede(a.snap)
        self.state.to_clean.append(n)

    def save_schedule(self, entries):
        touched = {}
        for n, channel, when in entries:
            a = self.state.active.get(n)
            if a is not None and channel in a.channels:
                a.channels[channel][0] = int(when)
                touched[n] = a
        for a in touched.values():
            try:
                self.garbage.write_snapshot(a)
            except QueueError as e:       # its older snapshot stays: due at that one's time
                self.state.warn(str(e))
        try:
            self.recovery.checkpoint(force=True)
        except CleanerLost:
            pass                              # exiting anyway; recovery cleans up
