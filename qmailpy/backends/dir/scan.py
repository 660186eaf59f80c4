"""Walks of the directory queue: the startup scan that loads the schedule, and the
36-hour cleanup walk; both finish what a power cut left of an ended message
(docs/queue-format.md "After a power cut (beyond qmail)").

Interface: DirScanner(state, holds) with a DirState (state.py) and a DirHolds
(holds.py). Reads info/, todo/, mess/, the channel files' mtimes and bounce/;
unlinks the channel, bounce, info and hold files of a message whose body is gone,
and orphaned channel and bounce files, logging each through state.warn; adds what
it finds to state.schedule (load) or returns it (scan_one, stale_messages). Owns
nothing.
"""
import os

from qmailpy.backends.base import SLEEP_SYSFAIL, QueueError, Scheduled
from qmailpy.backends.dir.schedule import RECHECK
from qmailpy.backends.dir.state import rel
from qmailpy.layout import CHANNELS, SPLIT, is_number
from qmailpy.states import LEFTOVER_AGE


class DirScanner:
    def __init__(self, state, holds):
        self.state = state
        self.holds = holds

    def load(self, now):
        """Add every info/ entry's Scheduled entries to the schedule (qmail-send's startup)."""
        for s in range(SPLIT):
            try:
                names = os.listdir("%s/info/%d" % (self.state.queue, s))
            except OSError:
                continue
            for name in names:
                if is_number(name):
                    for entry in self.scan_one(int(name), now):
                        self.state.schedule.add(entry)

    def scan_one(self, n, now):
        """Scheduled entries for one info/ entry (qmail's pqadd)."""
        path = self.state.path
        try:
            os.stat(path(rel("info", n)))
        except FileNotFoundError:
            return []
        except OSError:
            return self._scan_failed(n, "info", now)
        try:
            os.stat(path(rel("todo", n)))
            return []                       # preprocessing was interrupted; todo redoes it
        except FileNotFoundError:
            pass
        except OSError:
            return self._scan_failed(n, "todo", now)
        mess_rel = rel("mess", n)
        try:
            os.stat(path(mess_rel))
        except FileNotFoundError:
            return self._end_without_body(n, mess_rel, now)
        except OSError:
            return self._scan_failed(n, "mess", now)
        found = []
        for c in CHANNELS:
            try:
                st = os.stat(path(rel(c, n)))
            except FileNotFoundError:
                continue
            except OSError:
                return self._scan_failed(n, c, now)
            found.append(Scheduled(n, c, int(st.st_mtime)))
        if not found:
            found.append(Scheduled(n, None, now))
        return found

    def _end_without_body(self, n, mess_rel, now):
        """info/S/n whose body is gone: the message ended (or was deleted) and a power cut
        kept qmail-clean's removal of mess/S/n but lost the earlier ones (info/, channel
        and bounce files are never synced; mess/S/ is, by the next message queued
        there). Every delivery was made before the channel files went, and the bounce,
        if any, was queued before the bounce file went: finish the removals
        (docs/queue-format.md "After a power cut (beyond qmail)").

        No foop/n for qmail-clean: number n is free now, and a message being queued may
        already hold a new mess/S/n, which foop/n would remove."""
        try:
            self.remove_without_body(n, mess_rel)
        except QueueError as e:
            self.state.warn(str(e))
            return [Scheduled(n, RECHECK, now + SLEEP_SYSFAIL)]
        return []

    def remove_without_body(self, n, mess_rel):
        """Unlink what is left of message n after its body: channel files, then the
        bounce file, then info/ (qmail's order), then its hold marker, logging each;
        QueueError if an unlink fails."""
        state = self.state
        for kind in CHANNELS + ("bounce", "info"):
            left = rel(kind, n)
            if state.unlink_quietly(left):
                state.warn("removed %s left over from an ended message (no %s)" % (left, mess_rel))
        if n in state.held:
            self.holds.drop(n)
            state.warn("removed %s left over from an ended message (no %s)" % (rel("hold", n), mess_rel))

    def _scan_failed(self, n, kind, now):
        self.state.warn("unable to stat %s; will try again later" % rel(kind, n))
        return [Scheduled(n, RECHECK, now + SLEEP_SYSFAIL)]

    def _preprocessed_or_queued(self, n):
        return self.state.exists(rel("info", n)) or self.state.exists(rel("todo", n))

    def stale_messages(self, now):
        """The 36-hour cleanup walk: numbers of bodies to remove (mess/ older than 36
        hours with neither info/ nor todo/), and on the way None for each orphan it
        removed itself: a local/, remote/ or bounce/ file whose message has neither
        info/ nor todo/ (channel and bounce files are made after info/ and removed
        before it), which a power cut can leave (see preprocess.py, _create_info)."""
        for s in range(SPLIT):
            try:
                names = os.listdir("%s/mess/%d" % (self.state.queue, s))
            except OSError:
                continue
            for name in names:
                if not is_number(name):
                    continue
                n = int(name)
                try:
                    st = os.stat(self.state.path(rel("mess", n)))
                except OSError:
                    continue
                if now <= st.st_atime + LEFTOVER_AGE:
                    continue
                try:
                    if self._preprocessed_or_queued(n):
                        continue
                except QueueError:
                    continue
                yield n
        yield from self._orphans()

    def _orphans(self):
        dirs = ["%s/%d" % (c, s) for c in CHANNELS for s in range(SPLIT)] + ["bounce"]
        for d in dirs:
            try:
                names = os.listdir(self.state.path(d))
            except OSError:
                continue
            for name in names:
                if not is_number(name):
                    continue
                orphan = "%s/%s" % (d, name)
                try:
                    if self._preprocessed_or_queued(int(name)):
                        continue
                    if self.state.unlink_quietly(orphan):
                        self.state.warn("removed %s left over from an ended message" % orphan)
                except QueueError as e:
                    self.state.warn(str(e))
                yield None
