"""The directory backend's shared state: one DirState a DirQueue, handed to each part.

Owns: the queue directory's path, qmail-clean's client (`cleaner`: request(name) ->
reply byte, and optionally request_many and send_async; see
qmailpy.send.clean.CleanClient), the warning sink (`log`: bytes -> None), the
schedule (schedule.py), the hold markers in memory (`held`: n -> birth; `parked`: n ->
[Scheduled] of held messages, holds.py) and a batch of deletes waiting for commit()
(`deleting`: messages whose removal commit() finishes; commands.py), the names
removed whose directories are not yet synced (`unsynced`: channel files, todo/n,
info/S/n, bounce/n; sync_unsynced() before qmail-clean may remove a body, so that a
new message given the same number never meets them again after a power cut) and the
ended messages whose body waits for that sync (`completing`: numbers in the order
they ended, their foop/n sent once per loop turn; `completing_after`: no new try
before this epoch second after a failed sync; deliveries.py).

Provides the file operations every part uses, each turning an OSError into the
QueueError whose text is qmail-send's warning (without "warning: "), naming the
file relative to the queue directory. Reads and writes nothing else.
"""
import os
import time

from qmailpy.backends.base import QueueError
from qmailpy.backends.dir.schedule import DirSchedule
from qmailpy.fileio import fsync_dir
from qmailpy.layout import relpath


def now():
    """Epoch seconds, as the schedule keeps them."""
    return int(time.time())


def rel(kind, n):
    """Message n's file of `kind` relative to the queue ("foop" is qmail-clean's request name)."""
    if kind == "foop":
        return "foop/%d" % n
    return relpath(kind, n)


class DirState:
    def __init__(self, queue, cleaner=None, log=None):
        self.queue = queue
        self.cleaner = cleaner
        self.log = log
        self.schedule = DirSchedule()
        self.held, self.parked = {}, {}
        self.unsynced, self.deleting = set(), []
        self.completing, self.completing_after = [], 0

    def path(self, rel):
        return self.queue + "/" + rel

    def warn(self, text):
        if self.log is not None:
            self.log(b"warning: " + text.encode("utf-8", "surrogateescape") + b"\n")

    def clean(self, rel):
        """qmail-clean's reply to a request to remove rel (b"+" when done)."""
        if self.cleaner is None:
            raise QueueError("qmail-clean unable to clean up %s" % rel)
        return self.cleaner.request(rel)

    def exists(self, rel):
        """True/False; QueueError for stat errors other than ENOENT."""
        try:
            os.stat(self.path(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            raise QueueError("unable to stat %s; will try again later" % rel)

    def unlink_quietly(self, rel):
        """True if rel was there and is gone; ENOENT is False; other errors QueueError."""
        try:
            os.unlink(self.path(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            raise QueueError("unable to unlink %s" % rel)

    def sync_dir_of(self, rel):
        """fsync the directory of rel (a name added or removed there must survive)."""
        try:
            fsync_dir(os.path.dirname(self.path(rel)))
        except OSError:
            raise QueueError("unable to sync %s" % os.path.dirname(rel))

    def removed(self, rel):
        """rel was unlinked: its directory is synced at the next sync_unsynced()."""
        self.unsynced.add(rel)

    def sync_unsynced(self):
        """fsync each directory a name was removed from since the last call, once.

        qmail names a message by its body's inode: once qmail-clean unlinks mess/S/n, a
        new message may take n, and under POSIX a power cut may keep its body while
        bringing back an ended message's todo/n, info/S/n or channel files."""
        for dir_rel in sorted({os.path.dirname(r) for r in self.unsynced}):
            try:
                fsync_dir(self.path(dir_rel))
            except OSError:
                raise QueueError("unable to sync %s" % dir_rel)
        self.unsynced.clear()

    def utime(self, rel, when):
        """Set rel's mtime (a channel file's next attempt); a file gone is no error."""
        try:
            os.utime(self.path(rel), (when, when))
        except FileNotFoundError:
            pass
        except OSError:
            raise QueueError("unable to utime %s; message will be retried too soon" % rel)
