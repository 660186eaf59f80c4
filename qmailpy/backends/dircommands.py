"""The directory backend's side of qmail-send's commands (qmailctl queue ...): hold
markers and removal (docs/queue-format.md "hold/n").

A held message has hold/n, holding the message's birth (info/S/n's mtime) in
decimal and a LF, so that a marker a real qmail left behind when it finished
the message cannot hold a later message on the same inode: at startup a marker
whose birth does not match is removed. Real qmail ignores hold/ and delivers a
held message. The schedule entries of a held message are parked in memory as
they come due and go back to the schedule on release, at their own times.
"""
import os

from qmailpy.backends.base import QueueError, Scheduled
from qmailpy.fileio import write_all
from qmailpy.layout import CHANNELS, is_number


class DirCommands:
    """Mixin of DirQueue: needs self.held (n -> birth), self.parked (n -> [Scheduled]),
    self.unsynced (channel files unlinked, their directories not yet synced),
    self.deleting (messages whose removal commit() finishes), self.schedule, _path, _rel,
    _exists, _unlink_quietly, _sync_dir_of, _utime, _warn, channels_left and complete."""

    def load_holds(self):
        """Read hold/ at startup; remove markers of messages that are gone."""
        held = self.held
        try:
            names = os.listdir(self._path("hold"))
        except OSError:
            return
        for name in names:
            if not is_number(name):
                continue
            n = int(name)
            rel = self._rel("hold", n)
            try:
                with open(self._path(rel), "rb") as f:
                    marked = f.read(32)
                birth = self._birth(n)
            except (OSError, QueueError):
                birth = None
            if birth is not None and marked == b"%d\n" % birth:
                held[n] = birth
                continue
            try:
                if self._unlink_quietly(rel):
                    self._warn("removed %s left over from an ended message" % rel)
            except QueueError as e:
                self._warn(str(e))

    def _birth(self, n):
        try:
            return int(os.stat(self._path(self._rel("info", n))).st_mtime)
        except FileNotFoundError:
            return None
        except OSError:
            raise QueueError("unable to stat %s" % self._rel("info", n))

    def park_held(self, entries):
        """The entries of held messages are parked; the others returned."""
        held = self.held
        if not held:
            return entries
        free = []
        for e in entries:
            if e.n in held:
                self.parked.setdefault(e.n, []).append(e)
            else:
                free.append(e)
        return free

    def take(self, numbers, locator=None):
        preprocessed, queued = [], []
        for n in numbers:
            if self._exists(self._rel("todo", n)):
                queued.append(n)
            elif self._exists(self._rel("info", n)):
                preprocessed.append(n)
        return preprocessed, queued

    def bring(self, n):
        return True                 # its files are the message: nothing to load

    def let_go(self, n):
        pass

    def is_held(self, n):
        return n in self.held

    def hold(self, n):
        birth = self._birth(n)
        if birth is None:
            raise QueueError("unable to stat %s" % self._rel("info", n))
        rel = self._rel("hold", n)
        try:
            fd = os.open(self._path(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, b"%d\n" % birth)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            raise QueueError("unable to write %s" % rel)
        self._sync_dir_of(rel)
        self.held[n] = birth                     # due() parks its entries as they come up

    def release(self, n):
        self._drop_hold(n)
        for e in self.parked.pop(n, []):
            self.schedule.add(e)

    def _drop_hold(self, n):
        if self.held.pop(n, None) is None:
            return
        rel = self._rel("hold", n)
        if self._unlink_quietly(rel):
            self._sync_dir_of(rel)

    def requeue(self, n, now):
        self.schedule.take(n)
        self.parked.pop(n, None)
        for c in self.channels_left(n):
            self._utime(self._rel(c, n), now)
            self.schedule.add(Scheduled(n, c, now))

    def delete(self, n):
        """Channel files first: unlinked now (with its schedule entries gone, nothing is
        delivered of it after this), their directories synced by commit(), which only
        then removes the bounce notes, the hold marker and, by complete(), info and the
        body. One sync per directory for a batch, not per message. A crash between
        leaves a message with no channel: its next start completes it, bouncing any
        failures recorded before the delete."""
        self.schedule.take(n)
        self.parked.pop(n, None)
        for c in CHANNELS:
            rel = self._rel(c, n)
            if self._unlink_quietly(rel):
                self.unsynced.add(rel)
        self.deleting.append(n)

    def delete_queued(self, n):
        """What an interrupted preprocessing left (channel files, info/) first, so that a
        crash on the way never leaves a message that looks preprocessed without its todo;
        then todo/n and intd/n, and the body, through qmail-clean (their owner's)."""
        for kind in CHANNELS + ("info",):
            rel = self._rel(kind, n)
            if self._unlink_quietly(rel):
                self._sync_dir_of(rel)
        todo = self._rel("todo", n)
        if self._clean(todo) != b"+":
            raise QueueError("qmail-clean unable to clean up %s" % todo)
        foop = self._rel("foop", n)
        if self._clean(foop) != b"+":
            self._warn("qmail-clean unable to clean up %s" % foop)

    def commit(self):
        synced = set()
        for rel in self.unsynced:
            if os.path.dirname(rel) not in synced:
                self._sync_dir_of(rel)
                synced.add(os.path.dirname(rel))
        self.unsynced.clear()
        while self.deleting:
            n = self.deleting[0]
            self._unlink_quietly(self._rel("bounce", n))
            self._drop_hold(n)
            self.complete(n)
            self.deleting.pop(0)
