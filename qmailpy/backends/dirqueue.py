"""The directory queue backend: qmail's own layout, byte for byte (docs/queue-format.md "Queue directory layout"; docs/queue-format.md "File formats").

Every file name, record and order of operations here is qmail's, so a queue
written by this backend can be run by C qmail and the other way round. The
texts of QueueError are qmail-send's warning texts (without "warning: "),
naming the file relative to the queue directory.

Preprocessing (todo/ to info/ and the channel files) is dirpreprocess.py.
State lives in the files; the only per-message memory is the schedule
(dirschedule.py: one (due, n) per waiting channel, as qmail). todo/, intd/
and mess/ are only ever unlinked by qmail-clean, through the `cleaner`
(an object with request(name) -> reply byte; see qmailpy.send.clean.CleanClient).
"""
import errno
import itertools
import os
import time

from qmailpy import envelope
from qmailpy.backends.base import SLEEP_SYSFAIL, QueueBackend, QueueError, Scheduled
from qmailpy.backends.dircommands import DirCommands
from qmailpy.backends.dirpreprocess import DirPreprocessing
from qmailpy.backends.dirschedule import RECHECK, DirSchedule
from qmailpy.layout import CHANNELS, SPLIT, is_number, relpath
from qmailpy.states import LEFTOVER_AGE
from qmailpy.fileio import fsync_dir, write_all



def parse_channel_records(data):
    """ChannelRecords of a local/remote file, read as qmail-send's pass reads them.

    A torn last record (no NUL) is the end of the file. A record with an
    unknown letter ends the list with a ChannelRecord whose address is None:
    the pass stops there and logs "unknown record type" (docs/qmail-send.md "Log (fd 0, unbuffered, one line per event)")."""
    records = []
    pos = 0
    while True:
        end = data.find(b"\0", pos)
        if end < 0:
            return records
        kind = data[pos]
        if kind == 0x54 or kind == 0x44:          # T, D
            records.append(envelope.ChannelRecord(pos, kind == 0x44, data[pos + 1:end]))
        else:
            records.append(envelope.ChannelRecord(pos, False, None))
            return records
        pos = end + 1


def _now():
    return int(time.time())


class DirQueue(DirPreprocessing, DirCommands, QueueBackend):
    name = "dir"

    def __init__(self, home, cleaner=None, log=None):
        self.home = home
        self.queue = os.path.join(home, "queue")
        self.cleaner = cleaner
        self._log = log
        self.schedule = DirSchedule()
        self.held, self.parked = {}, {}     # hold/ markers (dircommands.py)
        self.unsynced, self.deleting = set(), []    # a batch of deletes until commit()
        if cleaner is not None and hasattr(cleaner, "send_async"):
            cleaner.on_late_reply = self._late_clean_reply

    # -- helpers -----------------------------------------------------------
    def _path(self, rel):
        return self.queue + "/" + rel

    @staticmethod
    def _rel(kind, n):
        if kind == "foop":
            return "foop/%d" % n
        return relpath(kind, n)

    def _warn(self, text):
        if self._log is not None:
            self._log(b"warning: " + text.encode("utf-8", "surrogateescape") + b"\n")

    def _late_clean_reply(self, name, reply):
        if reply != b"+":
            self._warn("qmail-clean unable to clean up %s" % name)

    def _clean(self, rel):
        if self.cleaner is None:
            raise QueueError("qmail-clean unable to clean up %s" % rel)
        return self.cleaner.request(rel)

    def _exists(self, rel):
        """True/False; QueueError for stat errors other than ENOENT."""
        try:
            os.stat(self._path(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            raise QueueError("unable to stat %s; will try again later" % rel)

    def _unlink_quietly(self, rel):
        """True if rel was there and is gone; ENOENT is False; other errors QueueError."""
        try:
            os.unlink(self._path(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            raise QueueError("unable to unlink %s" % rel)

    def _sync_dir_of(self, rel):
        """fsync the directory of rel (a name added or removed there must survive)."""
        try:
            fsync_dir(os.path.dirname(self._path(rel)))
        except OSError:
            raise QueueError("unable to sync %s" % os.path.dirname(rel))

    # -- startup and new work ------------------------------------------------
    def _scan_one(self, n, now):
        """Scheduled entries for one info/ entry (qmail's pqadd)."""
        try:
            os.stat(self._path(self._rel("info", n)))
        except FileNotFoundError:
            return []
        except OSError:
            return self._scan_failed(n, "info", now)
        try:
            os.stat(self._path(self._rel("todo", n)))
            return []                       # preprocessing was interrupted; todo redoes it
        except FileNotFoundError:
            pass
        except OSError:
            return self._scan_failed(n, "todo", now)
        mess_rel = self._rel("mess", n)
        try:
            os.stat(self._path(mess_rel))
        except FileNotFoundError:
            return self._end_without_body(n, mess_rel, now)
        except OSError:
            return self._scan_failed(n, "mess", now)
        found = []
        for c in CHANNELS:
            try:
                st = os.stat(self._path(self._rel(c, n)))
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
            self._remove_without_body(n, mess_rel)
        except QueueError as e:
            self._warn(str(e))
            return [Scheduled(n, RECHECK, now + SLEEP_SYSFAIL)]
        return []

    def _remove_without_body(self, n, mess_rel):
        """Unlink what is left of message n after its body: channel files, then the
        bounce file, then info/ (qmail's order), then its hold marker, logging each;
        QueueError if an unlink fails."""
        for kind in CHANNELS + ("bounce", "info"):
            rel = self._rel(kind, n)
            if self._unlink_quietly(rel):
                self._warn("removed %s left over from an ended message (no %s)" % (rel, mess_rel))
        if n in self.held:
            self._drop_hold(n)
            self._warn("removed %s left over from an ended message (no %s)" % (self._rel("hold", n), mess_rel))

    def _scan_failed(self, n, kind, now):
        self._warn("unable to stat %s; will try again later" % self._rel(kind, n))
        return [Scheduled(n, RECHECK, now + SLEEP_SYSFAIL)]

    def startup(self):
        """Load the schedule from info/ and the channel files' mtimes; offer what is due."""
        now = _now()
        self.load_holds()
        for s in range(SPLIT):
            try:
                names = os.listdir("%s/info/%d" % (self.queue, s))
            except OSError:
                continue
            for name in names:
                if is_number(name):
                    for entry in self._scan_one(int(name), now):
                        self.schedule.add(entry)
        return self.due(now)

    # -- the schedule --------------------------------------------------------
    def due(self, now=None):
        return self.park_held(self.schedule.due(_now() if now is None else now, self._scan_one))

    def next_wakeup(self):
        return self.schedule.next_wakeup(_now())

    def run_all_now(self):
        self.schedule.run_all_now(_now())

    def new_work(self):
        try:
            names = os.listdir(self._path("todo"))
        except OSError as e:
            raise QueueError("unable to opendir todo: %s" % e.strerror)
        return [int(name) for name in names if is_number(name)]

    # -- deliveries ----------------------------------------------------------
    def message_path(self, n):
        return "%d/%d" % (n % SPLIT, n)

    def info(self, n):
        rel = self._rel("info", n)
        try:
            fd = os.open(self._path(rel), os.O_RDONLY)
        except OSError:
            raise QueueError("unable to open %s" % rel)
        try:
            birth = int(os.fstat(fd).st_mtime)
            data = os.read(fd, 4096)
            while data.find(b"\0") < 0:
                more = os.read(fd, 65536)
                if not more:
                    break
                data += more
        except OSError:
            raise QueueError("trouble reading %s" % rel)
        finally:
            os.close(fd)
        end = data.find(b"\0")
        if end < 0 or not data.startswith(b"F"):
            raise QueueError("trouble reading %s" % rel)
        return data[1:end], birth

    def channel_file(self, n, channel):
        """The channel file's name relative to the queue, for log lines."""
        return self._rel(channel, n)

    def recipients(self, n, channel):
        rel = self._rel(channel, n)
        try:
            with open(self._path(rel), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise QueueError("trouble opening %s; will try again later" % rel)
        except OSError:
            raise QueueError("trouble reading %s; will try again later" % rel)
        return parse_channel_records(data)

    def mark_done(self, n, channel, record):
        rel = self._rel(channel, n)
        try:
            fd = os.open(self._path(rel), os.O_WRONLY)
        except OSError:
            raise QueueError("trouble marking %s; message will be delivered twice!" % rel)
        try:
            if os.pwrite(fd, b"D", record.offset) != 1:
                raise OSError(errno.EIO, "short write")
        except OSError:
            raise QueueError("trouble marking %s; message will be delivered twice!" % rel)
        finally:
            os.close(fd)
        record.done = True

    def add_bounce_note(self, n, note):
        """Append a failure to bounce/n, durably: the caller marks the recipient done
        next, after which this note is the only trace of the failure. The first note
        also syncs bounce/ (its new entry), which qmail leaves to the file system."""
        rel = self._rel("bounce", n)
        path = self._path(rel)
        created = True
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                created = False
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError:
            raise QueueError("unable to append to bounce message")
        try:
            write_all(fd, note)
            os.fsync(fd)
        except OSError:
            raise QueueError("unable to append to bounce message")
        finally:
            os.close(fd)
        if created:
            self._sync_dir_of(rel)

    def finish_channel(self, n, channel):
        rel = self._rel(channel, n)
        try:
            os.unlink(self._path(rel))
        except OSError:
            raise QueueError("unable to unlink %s; will try again later" % rel)
        self.schedule.drop(n, channel)
        return self.channels_left(n)

    def reschedule(self, n, channel, when):
        # qmail keeps the schedule in memory and writes it at exit; writing it
        # now as well means a crash does not make deferred mail due at once.
        self._utime(self._rel(channel, n), when)
        self.schedule.add(Scheduled(n, channel, when))

    def _utime(self, rel, when):
        try:
            os.utime(self._path(rel), (when, when))
        except FileNotFoundError:
            pass
        except OSError:
            raise QueueError("unable to utime %s; message will be retried too soon" % rel)

    def channels_left(self, n):
        return [c for c in CHANNELS if self._exists(self._rel(c, n))]

    def completion_due(self, n):
        if self.channels_left(n):
            return False                    # "false alarm"
        if self._exists(self._rel("todo", n)):
            return False                    # will be preprocessed again
        return self._exists(self._rel("info", n))

    # -- completion ----------------------------------------------------------
    def bounce_notes(self, n):
        rel = self._rel("bounce", n)
        try:
            with open(self._path(rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError:
            raise QueueError("unable to stat %s" % rel)

    def drop_bounce_notes(self, n):
        self._unlink_quietly(self._rel("bounce", n))

    def complete(self, n):
        self._drop_hold(n)
        rel = self._rel("info", n)
        try:
            os.unlink(self._path(rel))
        except FileNotFoundError:
            pass
        except OSError:
            raise QueueError("unable to unlink %s; will try again later" % rel)
        foop = self._rel("foop", n)
        if self.cleaner is not None and hasattr(self.cleaner, "send_async"):
            # the reply only ever produces a warning: read it later, do not wait
            self.cleaner.send_async(foop)
        elif self._clean(foop) != b"+":
            self._warn("qmail-clean unable to clean up %s" % foop)

    def save_schedule(self, entries):
        for n, channel, when in itertools.chain(entries, self.schedule.waiting()):
            try:
                self._utime(self._rel(channel, n), int(when))
            except QueueError as e:
                self._warn(str(e))

    def stale_messages(self, now):
        """The 36-hour cleanup walk: numbers of bodies to remove (mess/ older than 36
        hours with neither info/ nor todo/), and on the way None for each orphan it
        removed itself: a local/, remote/ or bounce/ file whose message has neither
        info/ nor todo/ (channel and bounce files are made after info/ and removed
        before it), which a power cut can leave (see dirpreprocess.py, _create_info)."""
        for s in range(SPLIT):
            try:
                names = os.listdir("%s/mess/%d" % (self.queue, s))
            except OSError:
                continue
            for name in names:
                if not is_number(name):
                    continue
                n = int(name)
                try:
                    st = os.stat(self._path(self._rel("mess", n)))
                except OSError:
                    continue
                if now <= st.st_atime + LEFTOVER_AGE:
                    continue
                try:
                    if self._exists(self._rel("info", n)) or self._exists(self._rel("todo", n)):
                        continue
                except QueueError:
                    continue
                yield n
        yield from self._orphans()

    def _orphans(self):
        dirs = ["%s/%d" % (c, s) for c in CHANNELS for s in range(SPLIT)] + ["bounce"]
        for d in dirs:
            try:
                names = os.listdir(self._path(d))
            except OSError:
                continue
            for name in names:
                if not is_number(name):
                    continue
                n = int(name)
                rel = "%s/%s" % (d, name)
                try:
                    if self._exists(self._rel("info", n)) or self._exists(self._rel("todo", n)):
                        continue
                    if self._unlink_quietly(rel):
                        self._warn("removed %s left over from an ended message" % rel)
                except QueueError as e:
                    self._warn(str(e))
                yield None

    # -- readers -------------------------------------------------------------
    def list_messages(self):
        from qmailpy.backends import dirlist
        return dirlist.list_messages(self.queue)

    def counts(self):
        from qmailpy.backends import dirlist
        return dirlist.counts(self.queue)
