"""Deliveries and completion on the directory backend: what qmail-send reads and
writes of a preprocessed message (docs/queue-format.md "File formats").

Interface: DirDeliveries(state, holds) with a DirState (state.py) and a DirHolds
(holds.py). Reads info/S/n, the channel files and bounce/n; writes a channel
file's D marks (pwrite at the record's offset), its mtime (the next attempt),
bounce/n (appended, fsync'd); unlinks channel files, bounce/n and info/S/n; once per
loop turn (flush_completions) syncs their directories (state.sync_unsynced) and only
then asks qmail-clean (state.cleaner) to remove the rest (foop/n) of every message
ended since (state.completing). Keeps state.schedule in step with the channel files.
Owns nothing.
"""
import errno
import itertools
import os

from qmailpy import envelope
from qmailpy.backends.base import SLEEP_SYSFAIL, QueueError, Scheduled
from qmailpy.backends.dir.state import now, rel
from qmailpy.fileio import write_all
from qmailpy.layout import CHANNELS


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


class DirDeliveries:
    def __init__(self, state, holds):
        self.state = state
        self.holds = holds

    def info(self, n):
        """(sender, birth) from info/S/n (birth: its mtime)."""
        info_rel = rel("info", n)
        try:
            fd = os.open(self.state.path(info_rel), os.O_RDONLY)
        except OSError:
            raise QueueError("unable to open %s" % info_rel)
        try:
            birth = int(os.fstat(fd).st_mtime)
            data = os.read(fd, 4096)
            while data.find(b"\0") < 0:
                more = os.read(fd, 65536)
                if not more:
                    break
                data += more
        except OSError:
            raise QueueError("trouble reading %s" % info_rel)
        finally:
            os.close(fd)
        end = data.find(b"\0")
        if end < 0 or not data.startswith(b"F"):
            raise QueueError("trouble reading %s" % info_rel)
        return data[1:end], birth

    def recipients(self, n, channel):
        channel_rel = rel(channel, n)
        try:
            with open(self.state.path(channel_rel), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise QueueError("trouble opening %s; will try again later" % channel_rel)
        except OSError:
            raise QueueError("trouble reading %s; will try again later" % channel_rel)
        return parse_channel_records(data)

    def mark_done(self, n, channel, record):
        channel_rel = rel(channel, n)
        try:
            fd = os.open(self.state.path(channel_rel), os.O_WRONLY)
        except OSError:
            raise QueueError("trouble marking %s; message will be delivered twice!" % channel_rel)
        try:
            if os.pwrite(fd, b"D", record.offset) != 1:
                raise OSError(errno.EIO, "short write")
        except OSError:
            raise QueueError("trouble marking %s; message will be delivered twice!" % channel_rel)
        finally:
            os.close(fd)
        record.done = True

    def add_bounce_note(self, n, note):
        """Append a failure to bounce/n, durably: the caller marks the recipient done
        next, after which this note is the only trace of the failure. The first note
        also syncs bounce/ (its new entry), which qmail leaves to the file system."""
        bounce_rel = rel("bounce", n)
        path = self.state.path(bounce_rel)
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
            self.state.sync_dir_of(bounce_rel)

    def finish_channel(self, n, channel):
        channel_rel = rel(channel, n)
        try:
            os.unlink(self.state.path(channel_rel))
        except OSError:
            raise QueueError("unable to unlink %s; will try again later" % channel_rel)
        self.state.removed(channel_rel)
        self.state.schedule.drop(n, channel)
        return self.channels_left(n)

    def reschedule(self, n, channel, when):
        # qmail keeps the schedule in memory and writes it at exit; writing it
        # now as well means a crash does not make deferred mail due at once.
        self.state.utime(rel(channel, n), when)
        self.state.schedule.add(Scheduled(n, channel, when))

    def channels_left(self, n):
        return [c for c in CHANNELS if self.state.exists(rel(c, n))]

    def completion_due(self, n):
        if self.channels_left(n):
            return False                    # "false alarm"
        if self.state.exists(rel("todo", n)):
            return False                    # will be preprocessed again
        return self.state.exists(rel("info", n))

    def bounce_notes(self, n):
        bounce_rel = rel("bounce", n)
        try:
            with open(self.state.path(bounce_rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError:
            raise QueueError("unable to stat %s" % bounce_rel)

    def drop_bounce_notes(self, n):
        if self.state.unlink_quietly(rel("bounce", n)):
            self.state.removed(rel("bounce", n))

    def complete(self, n):
        """Unlink the hold marker and info/S/n (S5 -> S2) and note n as waiting for its
        body's removal, which flush_completions() asks qmail-clean for once per loop turn."""
        self.holds.drop(n)
        info_rel = rel("info", n)
        try:
            os.unlink(self.state.path(info_rel))
            self.state.removed(info_rel)
        except FileNotFoundError:
            pass
        except OSError:
            raise QueueError("unable to unlink %s; will try again later" % info_rel)
        if n not in self.state.completing:      # the 36-hour walk may name it again
            self.state.completing.append(n)

    def completions_wakeup(self):
        """Now while a message waits for flush_completions() (after a failed sync, its
        retry time); None when none waits."""
        if not self.state.completing:
            return None
        return self.state.completing_after

    def flush_completions(self):
        """Sync the directories of every name removed so far (the waiting messages'
        todo/n, channel files, bounce/n and info/S/n, and any other's since the last
        sync: one fsync per directory for all of them), then ask qmail-clean for foop/n
        of each waiting message, in the order they ended. The body goes last and only
        then may a new message take number n (its inode): a power cut must not bring
        back the old message's names under the new body (docs/queue-format.md "Delivery
        and completion (S5→S1)"). One sync per loop turn, not per message: a crash before it
        leaves S2 leftovers (info/ gone, mess/ kept, the number not reusable), which the
        36-hour cleanup removes. A failed sync keeps them waiting SLEEP_SYSFAIL seconds."""
        state = self.state
        if not state.completing or state.completing_after > now():
            return
        try:
            state.sync_unsynced()
        except QueueError:
            state.completing_after = now() + SLEEP_SYSFAIL
            raise
        cleaner = state.cleaner
        while state.completing:
            foop = rel("foop", state.completing.pop(0))
            if cleaner is not None and hasattr(cleaner, "send_async"):
                # the reply only ever produces a warning: read it later, do not wait
                cleaner.send_async(foop)
            elif state.clean(foop) != b"+":
                state.warn("qmail-clean unable to clean up %s" % foop)

    def late_clean_reply(self, name, reply):
        """The reply to a send_async request, read later: only ever a warning."""
        if reply != b"+":
            self.state.warn("qmail-clean unable to clean up %s" % name)

    def save_schedule(self, entries):
        """Write each entry's due time, and the schedule's, to its channel file's mtime."""
        for n, channel, when in itertools.chain(entries, self.state.schedule.waiting()):
            try:
                self.state.utime(rel(channel, n), int(when))
            except QueueError as e:
                self.state.warn(str(e))
