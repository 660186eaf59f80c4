"""The directory backend's side of qmail-send's commands (qmailctl queue ...): finding
the messages named, requeue and removal (hold and release: holds.py).

Interface: DirCommands(state, holds, deliveries) with a DirState (state.py), a
DirHolds (holds.py) and a DirDeliveries (deliveries.py, whose complete() ends a
deleted message). Reads todo/ and info/; sets channel files' mtimes (requeue);
unlinks channel files at once and, at commit(), syncs their directories and removes
the bounce notes, the hold marker, info/ and the body; asks qmail-clean to remove
what a queued message has (todo/, intd/, mess/). Keeps the batch of deletes in
state.unsynced and state.deleting, and state.schedule in step. Owns nothing.
"""

from qmailpy.backends.base import QueueError, Scheduled
from qmailpy.backends.dir.state import rel
from qmailpy.layout import CHANNELS


class DirCommands:
    def __init__(self, state, holds, deliveries):
        self.state = state
        self.holds = holds
        self.deliveries = deliveries

    def take(self, numbers):
        """(preprocessed, queued): the numbers with info/S/n and those with todo/n."""
        preprocessed, queued = [], []
        for n in numbers:
            if self.state.exists(rel("todo", n)):
                queued.append(n)
            elif self.state.exists(rel("info", n)):
                preprocessed.append(n)
        return preprocessed, queued

    def requeue(self, n, now):
        state = self.state
        state.schedule.take(n)
        state.parked.pop(n, None)
        for c in self.deliveries.channels_left(n):
            state.utime(rel(c, n), now)
            state.schedule.add(Scheduled(n, c, now))

    def delete(self, n):
        """Channel files first: unlinked now (with its schedule entries gone, nothing is
        delivered of it after this), their directories synced by commit(), which only
        then removes the bounce notes, the hold marker and, by complete(), info and the
        body. One sync per directory for a batch, not per message. A crash between
        leaves a message with no channel: its next start completes it, bouncing any
        failures recorded before the delete."""
        state = self.state
        state.schedule.take(n)
        state.parked.pop(n, None)
        for c in CHANNELS:
            channel_rel = rel(c, n)
            if state.unlink_quietly(channel_rel):
                state.removed(channel_rel)
        state.deleting.append(n)

    def delete_queued(self, n):
        """What an interrupted preprocessing left (channel files, info/) first, so that a
        crash on the way never leaves a message that looks preprocessed without its todo;
        then todo/n and intd/n, and the body, through qmail-clean (their owner's). A hold/n
        that preprocessing wrote before it was interrupted goes first."""
        state = self.state
        self.holds.drop(n)
        for kind in CHANNELS + ("info",):
            left = rel(kind, n)
            if state.unlink_quietly(left):
                state.sync_dir_of(left)
        todo = rel("todo", n)
        if state.clean(todo) != b"+":
            raise QueueError("qmail-clean unable to clean up %s" % todo)
        state.removed(todo)
        state.sync_unsynced()               # todo/n gone for good before the body may be
        foop = rel("foop", n)
        if state.clean(foop) != b"+":
            state.warn("qmail-clean unable to clean up %s" % foop)

    def commit(self):
        state = self.state
        state.sync_unsynced()
        while state.deleting:
            n = state.deleting[0]
            state.unlink_quietly(rel("bounce", n))
            self.holds.drop(n)
            self.deliveries.complete(n)
            state.deleting.pop(0)
        self.deliveries.flush_completions()     # a delete's body goes now, not at a loop turn
