"""Hold markers on the directory backend (docs/queue-format.md "hold/n").

A held message has hold/n, holding the message's birth (info/S/n's mtime) in
decimal and a LF, so that a marker a real qmail left behind when it finished
the message cannot hold a later message on the same inode: at startup a marker
whose birth does not match is removed. Real qmail ignores hold/ and delivers a
held message. The schedule entries of a held message are parked in memory as
they come due and go back to the schedule on release, at their own times.

Interface: DirHolds(state) with a DirState (state.py). Reads hold/ and info/S/n's
mtime; writes and unlinks hold/n (synced with its directory); owns nothing of its
own: state.held (n -> birth) and state.parked (n -> [Scheduled]) are the memory it
keeps, state.schedule where released entries go back.
"""
import os

from qmailpy.backends.base import QueueError
from qmailpy.backends.dir.state import rel
from qmailpy.fileio import write_all
from qmailpy.layout import is_number


class DirHolds:
    def __init__(self, state):
        self.state = state

    def load(self):
        """Read hold/ at startup; remove markers of messages that are gone."""
        state = self.state
        try:
            names = os.listdir(state.path("hold"))
        except OSError:
            return
        for name in names:
            if not is_number(name):
                continue
            n = int(name)
            marker = rel("hold", n)
            try:
                with open(state.path(marker), "rb") as f:
                    marked = f.read(32)
                birth = self.birth(n)
            except (OSError, QueueError):
                birth = None
            if birth is not None and marked == b"%d\n" % birth:
                state.held[n] = birth
                continue
            try:
                if state.unlink_quietly(marker):
                    state.warn("removed %s left over from an ended message" % marker)
            except QueueError as e:
                state.warn(str(e))

    def birth(self, n):
        """info/S/n's mtime, or None when there is no info/S/n."""
        try:
            return int(os.stat(self.state.path(rel("info", n))).st_mtime)
        except FileNotFoundError:
            return None
        except OSError:
            raise QueueError("unable to stat %s" % rel("info", n))

    def park(self, entries):
        """The entries of held messages are parked; the others returned."""
        held = self.state.held
        if not held:
            return entries
        free = []
        for e in entries:
            if e.n in held:
                self.state.parked.setdefault(e.n, []).append(e)
            else:
                free.append(e)
        return free

    def is_held(self, n):
        return n in self.state.held

    def hold(self, n):
        birth = self.birth(n)
        if birth is None:
            raise QueueError("unable to stat %s" % rel("info", n))
        marker = rel("hold", n)
        try:
            fd = os.open(self.state.path(marker), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, b"%d\n" % birth)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            raise QueueError("unable to write %s" % marker)
        self.state.sync_dir_of(marker)
        self.state.held[n] = birth               # due() parks its entries as they come up

    def release(self, n):
        self.drop(n)
        for e in self.state.parked.pop(n, []):
            self.state.schedule.add(e)

    def drop(self, n):
        """Forget message n's hold and unlink its marker (synced); nothing if not held."""
        if self.state.held.pop(n, None) is None:
            return
        marker = rel("hold", n)
        if self.state.unlink_quietly(marker):
            self.state.sync_dir_of(marker)
