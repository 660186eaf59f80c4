"""The one queue interface both backends implement (docs/architecture.md "Queue backends").

qmail-send, qmail-qread, qmail-qstat and qmailctl talk to the queue only through
this interface; qmail-queue's enqueue path lives in each backend's own module
because it runs in a short-lived process that must import almost nothing.

Channel names are "local" and "remote". Message numbers are mess inodes.
Recipient records are envelope.ChannelRecord objects (offset, done, address);
the offset is opaque to callers and only handed back to mark_done().

Scheduling: the backend owns the schedule, in one model for both backends.
  startup()        loads it (the directory backend from the channel files' mtimes,
                   the log backend from its checkpoint and snapshots) and returns
                   the entries due now, as due() would.
  due(now)         hands out the Scheduled entries that are due: a channel's next
                   pass, or (channel None) a message's completion. An entry handed
                   out belongs to the caller until it hands it back.
  next_wakeup()    when due() may find more; the caller calls due() by then.
  reschedule()     hands a channel back after a pass that left recipients to try:
                   the backend offers it again through due() at `when`. If it
                   raises QueueError the backend did not take it: the caller keeps
                   the entry and tries the pass again at `when` itself.
  run_all_now()    SIGALRM: everything waiting is due now.
  save_schedule()  orderly exit: the entries the caller still holds, written with
                   the backend's own so a restart resumes on time.
finish_channel() ends a channel (the caller schedules completion once
channels_left() is empty); preprocess() hands the new message's channels to the
caller, due now. What the caller holds is only work that is due (or its own short
retries after an error), so the memory per waiting message is the backend's: the
directory backend's is one (due, n) per waiting channel (dir/schedule.py); the log
backend keeps none for a message nobody is working on (its queue runners,
log/runners.py, find due work by reading the log).
"""
from abc import ABC, abstractmethod

from qmailpy.layout import SPLIT


class CleanerLost(Exception):
    """The cleaner (qmail-clean's pipe) hit EOF or EPIPE: qmail-send must exit.

    Defined with the interface because a backend passes it through from the
    cleaner it was given; qmail-send's CleanClient raises it."""


class QueueError(Exception):
    """A queue operation failed; the caller logs str(self) and retries later."""


class SetAside(QueueError):
    """preprocess() cannot record message n (str(self) says why): the backend leaves it
    where it is and does not offer it again until qmail-send starts again; qmail-send
    logs logline.set_aside (docs/qmail-send.md "Messages set aside")."""


SLEEP_SYSFAIL = 123      # seconds before a step that failed on a system error is tried again


class Located:
    """The locator of a backend that finds a message by its number at once."""

    def step(self):
        return True


class Scheduled:
    """Work that is due: channel 'local'/'remote' due at `due`, or channel None = completion."""
    __slots__ = ("n", "channel", "due")

    def __init__(self, n, channel, due):
        self.n, self.channel, self.due = n, channel, due

    def __repr__(self):
        return "Scheduled(%d, %r, %r)" % (self.n, self.channel, self.due)


class Preprocessed:
    """What preprocessing learned about a message: for the log lines and the scheduler."""
    __slots__ = ("n", "sender", "size", "qp", "uid", "birth", "channels")

    def __init__(self, n, sender, size, qp, uid, birth, channels):
        self.n, self.sender, self.size, self.qp, self.uid = n, sender, size, qp, uid
        self.birth = birth
        self.channels = channels        # tuple of channel names that got recipients


class MessageView:
    """One queued message as qmail-qread and snapshots show it."""
    __slots__ = ("n", "state", "birth", "size", "sender", "local", "remote", "bouncing", "error")

    def __init__(self, n, state, birth=None, size=None, sender=None, local=(), remote=(),
                 bouncing=False, error=None):
        self.n, self.state, self.birth, self.size, self.sender = n, state, birth, size, sender
        self.local, self.remote = list(local), list(remote)
        self.bouncing, self.error = bouncing, error


class QueueBackend(ABC):
    """Abstract queue. Every method either succeeds or raises QueueError."""

    name = None

    # -- qmail-send: startup and new work ---------------------------------
    @abstractmethod
    def startup(self):
        """Load the schedule of everything preprocessed but unfinished (docs/qmail-send.md "Startup" step 4).

        Returns the Scheduled entries due now, as due() would."""

    @abstractmethod
    def new_work(self):
        """Message numbers queued but not yet preprocessed (the todo scan)."""

    @abstractmethod
    def preprocess(self, n, route):
        """Split message n's recipients into channels; route(addr) -> (channel, addr).

        Returns Preprocessed. Afterwards the message is in S5 (docs/queue-format.md "Preprocessing (qmail-send + qmail-clean, S4→S5)")."""

    def preprocess_batch(self, numbers, route, announce=None):
        """preprocess() for several messages: [(n, Preprocessed or QueueError)].

        announce(line), when given, receives qmail-send's `new msg` and `info msg`
        log lines. qmail writes them while it preprocesses, before todo/ is
        cleaned (docs/queue-format.md "Preprocessing (qmail-send + qmail-clean, S4→S5)"); a backend that can do the same overrides this. This
        default announces a message once preprocess() has succeeded."""
        from qmailpy import logline
        results = []
        for n in numbers:
            try:
                p = self.preprocess(n, route)
            except QueueError as e:
                results.append((n, e))
                continue
            if announce is not None:
                announce(logline.new_msg(n))
                if p.sender is not None:
                    announce(logline.info_msg(n, p.size, p.sender, p.qp, p.uid))
            results.append((n, p))
        return results

    # -- qmail-send: deliveries -------------------------------------------
    # Each backend's `deliveries` part (dir/deliveries.py, log/deliveries.py) does this
    # work; the methods here and in "completion" below forward to it.
    deliveries = None

    @abstractmethod
    def message_path(self, n):
        """The mess file relative to queue/mess, as the spawn protocol sends it ("5/457")."""

    def info(self, n):
        """(sender, birth) of a preprocessed message."""
        return self.deliveries.info(n)

    def recipients(self, n, channel):
        """The ChannelRecords of one channel, done and pending, in order."""
        return self.deliveries.recipients(n, channel)

    def mark_done(self, n, channel, record):
        """Record that one recipient is finished (success or permanent failure); durable
        at the next sync_results() at the latest."""
        return self.deliveries.mark_done(n, channel, record)

    def sync_results(self):
        """Make the mark_done() calls made so far durable (QueueError if that fails).
        qmail-send calls it once after each batch of delivery reports, before it acts on
        them (completion, bounces), so that reports arriving together share one fsync."""

    def add_bounce_note(self, n, note):
        """Append one bounce note (envelope.bounce_note bytes) for message n."""
        return self.deliveries.add_bounce_note(n, note)

    def finish_channel(self, n, channel):
        """Every recipient of the channel is done: drop the channel. Returns the
        names of the channels left (as channels_left() would have, just before a
        backend may let go of a message whose other channels wait for a retry)."""
        return self.deliveries.finish_channel(n, channel)

    def reschedule(self, n, channel, when):
        """The channel's next attempt is at `when` (epoch seconds): the backend offers it
        again through due() then. QueueError: it did not take it; the caller keeps it."""
        return self.deliveries.reschedule(n, channel, when)

    def channels_left(self, n):
        """Channel names of message n that still exist."""
        return self.deliveries.channels_left(n)

    def channel_file(self, n, channel):
        """How log lines name a channel of message n ("local/5/457" in qmail's layout)."""
        return "%s/%d/%d" % (channel, n % SPLIT, n)

    def completion_due(self, n):
        """True when message n is ready for completion (no channel left, nothing to redo)."""
        return self.deliveries.completion_due(n)

    # -- qmail-send: the schedule (see the module docstring) ----------------
    @abstractmethod
    def due(self, now):
        """Scheduled entries that are due at `now` and were not handed out before."""

    @abstractmethod
    def next_wakeup(self):
        """Epoch second by which due() should be called again, or None."""

    @abstractmethod
    def run_all_now(self):
        """SIGALRM (docs/qmail-send.md "Signals"): everything waiting is offered through due() now."""

    # -- qmail-send: completion -------------------------------------------
    def bounce_notes(self, n):
        """The accumulated bounce notes (bytes), or None when nothing failed."""
        return self.deliveries.bounce_notes(n)

    def drop_bounce_notes(self, n):
        """Forget the bounce notes once the bounce message is queued (or discarded)."""
        return self.deliveries.drop_bounce_notes(n)

    def complete(self, n):
        """Finish message n: S5 -> S2 -> S1 (a backend may leave S2 -> S1 to
        flush_completions())."""
        return self.deliveries.complete(n)

    def flush_completions(self):
        """qmail-send calls this once per loop turn, after the turn's completions, and at
        orderly exit: a backend that batches the last step of complete() (the directory
        backend: one directory sync, then the bodies' removal) does it here, and its
        next_wakeup() is now while any waits. Nothing by default."""

    def save_schedule(self, entries):
        """Orderly exit: persist each (n, channel, when) the caller still holds, and the
        backend's own schedule, so a restart resumes on time."""
        return self.deliveries.save_schedule(entries)

    @abstractmethod
    def stale_messages(self, now):
        """Numbers of S2/S3 leftovers past the 36-hour rule, for elimination; None
        for a step of the walk with nothing for the caller to do (a backend may clean
        its own orphans on the way, one step at a time, so the walk never blocks)."""

    # -- qmail-send: commands (qmailctl queue ...; send/commands.py) ------
    # qmail-send calls these only for a message none of whose deliveries is in flight
    # and none of whose scheduled entries it holds. A command may name a great many
    # messages: qmail-send locates them once (in steps, between its other work), then
    # takes and acts on a few at a time, and commit()s each batch before it answers.
    def locate(self, numbers):
        """A Locator for a command's numbers (ascending, no repeats): its step() does
        a bounded part of the work of finding them and says True once they are found;
        the backend keeps it up to date with its own changes until forget(locator)."""
        return Located()

    def forget(self, locator):
        """The command is answered: the backend stops keeping the locator up to date."""

    @abstractmethod
    def take(self, numbers, locator=None):
        """(preprocessed, queued): of these numbers (a batch of the locator's, or any
        numbers without one), those in S5 and those still in S4. Each preprocessed
        number is then brought in with bring(), one at a time."""

    @abstractmethod
    def bring(self, n):
        """Ready message n, which take() found in S5, for the calls below and the delivery
        calls until let_go(); False if it is no longer there."""

    @abstractmethod
    def let_go(self, n):
        """qmail-send is done with a message take() gave it (if it is still queued)."""

    def commit(self):
        """Make the hold, release and delete calls made so far durable (QueueError if
        that fails); qmail-send calls it before it answers them."""

    def is_set_aside(self, n):
        """True for a queued message n that preprocess() set aside (SetAside) in this run."""
        return False

    @abstractmethod
    def delete_queued(self, n):
        """Remove message n, which take() found still queued (S4), without delivering or
        bouncing it: S4 -> S1, durable at the next commit(). qmail-send does so only for
        a message it set aside; `qmailctl queue delete` while qmail-send is down, for any."""

    @abstractmethod
    def is_held(self, n):
        """True while message n is held: the schedule never offers it."""

    @abstractmethod
    def hold(self, n):
        """Hold message n (durable at the next commit(): it then stays held across restarts)."""

    @abstractmethod
    def release(self, n):
        """End a hold: n's channels are due at their times again (at once if passed)."""

    @abstractmethod
    def requeue(self, n, now):
        """Every channel of message n is due at `now` (it must not be held)."""

    @abstractmethod
    def delete(self, n):
        """Remove message n without delivering or bouncing: S5 -> S1, by the same
        removal path as complete(); nothing is delivered of it once this returns."""

    # -- readers: qmail-qread, qmail-qstat, snapshots ---------------------
    @abstractmethod
    def list_messages(self):
        """MessageViews of every preprocessed message, in qmail-qread order."""

    @abstractmethod
    def counts(self):
        """(messages in queue, messages not yet preprocessed)."""
