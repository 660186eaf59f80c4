"""Preprocessing on the directory backend (S4 -> S5): todo/n becomes info/S/n and the
channel files local/S/n and remote/S/n, then qmail-clean removes todo/n
(docs/queue-format.md "Preprocessing (qmail-send + qmail-clean, S4→S5)").
The order of operations, file names and records are qmail's.

Interface: DirPreprocessor(state, scanner) with a DirState (state.py) and a DirScanner
(scan.py, which removes what is left of a message whose body is gone). Reads todo/n
and mess/S/n's size; creates and fsyncs info/S/n and the channel files, fsyncs their
directories, unlinks what an earlier life of the number left, and asks qmail-clean
(state.cleaner) to remove todo/n. Returns Preprocessed (base.py); owns nothing.
A message whose mess file carries the hold bit of its queueing (qmailpy.mess.HOLD_MODE,
docs/queue-format.md "Hold at queueing") gets its hold/n (holds.py) after its info and
channel files are durable and before todo/n goes: no delivery of it can start unheld.
"""
import os

from qmailpy import envelope, logline
from qmailpy.backends.base import Preprocessed, QueueError
from qmailpy.backends.dir.holds import DirHolds
from qmailpy.backends.dir.state import rel
from qmailpy.fileio import fsync_dir, write_all
from qmailpy.layout import CHANNELS
from qmailpy.mess import hold_asked


class DirPreprocessor:
    def __init__(self, state, scanner):
        self.state = state
        self.scanner = scanner
        self.holds = DirHolds(state)     # keeps nothing of its own: state.held is the memory
        self.hold_asked = set()          # numbers _prepare found with the hold bit

    def preprocess(self, n, route, announce=None):
        prepared = self._prepare(n, route, announce)
        self._commit(prepared)
        self._sync_dirs([prepared])
        self._hold([prepared])
        return self._clean_todo(prepared)

    def _hold(self, committed):
        """hold/n of each message whose queueing asked a hold; QueueError if one fails."""
        for result, _ in committed:
            if result.n in self.hold_asked:
                self.holds.hold(result.n)
                self.hold_asked.discard(result.n)

    def preprocess_batch(self, numbers, route, announce=None):
        """preprocess() for several messages at once: [(n, Preprocessed or QueueError)].

        Every file is written first and fsync'd afterwards, so one journal commit
        covers them all; then the todo/ requests go to qmail-clean in one write.
        Each message still has its info and channel files on disk before its todo
        entry goes (docs/queue-format.md "Preprocessing (qmail-send + qmail-clean, S4→S5)"). announce gets `new msg` and `info msg` where qmail
        logs them (see _prepare). CleanerLost propagates."""
        results = []
        ready = []
        for n in numbers:
            try:
                ready.append(self._prepare(n, route, announce))
            except QueueError as e:
                results.append((n, e))
        committed = []
        for prepared in ready:
            try:
                self._commit(prepared)
                committed.append(prepared)
            except QueueError as e:
                results.append((prepared[0].n, e))
        try:
            self._sync_dirs(committed)
        except QueueError as e:
            results.extend((p[0].n, e) for p in committed)
            committed = []
        unheld = []
        for prepared in committed:
            try:
                self._hold([prepared])
                unheld.append(prepared)
            except QueueError as e:         # todo/n stays: tried again at the next scan
                results.append((prepared[0].n, e))
        committed = unheld
        if committed:
            names = [rel("todo", p[0].n) for p in committed]
            if self.state.cleaner is None:
                replies = [b"!"] * len(names)
            elif hasattr(self.state.cleaner, "request_many"):
                replies = self.state.cleaner.request_many(names)
            else:
                replies = [self.state.cleaner.request(name) for name in names]
            for prepared, name, reply in zip(committed, names, replies):
                if reply == b"+":
                    self.state.removed(name)    # synced before any body's removal
                    results.append((prepared[0].n, prepared[0]))
                else:
                    results.append((prepared[0].n, QueueError("qmail-clean unable to clean up %s" % name)))
        return results

    def _clean_todo(self, prepared):
        todo_rel = rel("todo", prepared[0].n)
        if self.state.clean(todo_rel) != b"+":
            raise QueueError("qmail-clean unable to clean up %s" % todo_rel)
        self.state.removed(todo_rel)
        return prepared[0]

    def _sync_dirs(self, committed):
        """fsync the info/, local/ and remote/ split directories that got new entries.

        Beyond qmail, as qmail-queue does (syncdir): once todo/n is gone, info/S/n is
        the message's only envelope, and ext4/xfs keep a new directory entry across a
        power cut only after an fsync of its directory."""
        dirs = set()
        for result, _ in committed:
            dirs.add(os.path.dirname(rel("info", result.n)))
            dirs.update(os.path.dirname(rel(channel, result.n)) for channel in result.channels)
        for dir_rel in sorted(dirs):
            try:
                fsync_dir(self.state.path(dir_rel))
            except OSError:
                raise QueueError("trouble fsyncing %s" % dir_rel)

    def _commit(self, prepared):
        """fsync and close the files _prepare wrote: info first, then each channel file."""
        result, fds = prepared
        try:
            for kind in ("info",) + CHANNELS:
                if kind in fds:
                    file_rel = rel(kind, result.n)
                    try:
                        os.fsync(fds[kind])
                    except OSError:
                        raise QueueError("trouble fsyncing %s" % file_rel)
                    if kind == "info":
                        result.birth = int(os.fstat(fds[kind]).st_mtime)
                    os.close(fds.pop(kind))
        finally:
            for fd in fds.values():
                os.close(fd)
            fds.clear()

    def _create_info(self, n, info_rel):
        """info/S/n created O_EXCL, after removing what an earlier life of number n left.

        qmail unlinks local, remote and info before creating info when an interrupted
        attempt left info. Channel and bounce files are created after info and removed
        before it, so on a disk that keeps the order of name operations they never
        outlive info; but none of those unlinks is fsync'd, and after a power cut the
        disk may keep info's removal and lose a channel or bounce file's. A new message
        that reuses the number (mess/ inodes are reused) would then inherit the old
        message's recipients or bounce notes, so they are removed here too."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(self.state.path(info_rel), flags, 0o600)
        except FileExistsError:
            for kind in ("local", "remote", "info"):
                self.state.unlink_quietly(rel(kind, n))
            fd = os.open(self.state.path(info_rel), flags, 0o600)
        removed = [left for left in (rel(kind, n) for kind in ("local", "remote", "bounce"))
                   if self.state.unlink_quietly(left)]
        for left in removed:
            self.state.warn("removed %s left over from an earlier message %d" % (left, n))
            self.state.sync_dir_of(left)
        return fd

    def _drop_ended_todo(self, n, mess_rel):
        """todo/n without its body: qmail-queue links todo/ only after mess/ is durable,
        and mess/ goes only after the message ended, so this todo entry's own removal
        was lost to a power cut after the message ended, and so may be the removals of
        its info/, channel and bounce files. Remove those, then ask qmail-clean to
        remove todo/n (it would be tried every scan for good); QueueError says what
        happened."""
        todo_rel = rel("todo", n)
        self.scanner.remove_without_body(n, mess_rel)
        if self.state.clean(todo_rel) != b"+":
            raise QueueError("qmail-clean unable to clean up %s" % todo_rel)
        raise QueueError("removed %s left over from an ended message (no %s)" % (todo_rel, mess_rel))

    def _prepare(self, n, route, announce=None):
        """Steps of preprocessing up to (not including) the fsyncs: (Preprocessed, open fds).

        As in qmail, `new msg` is announced once info/ is created and `info msg`
        when the sender record is written, so a todo entry that fails later (a
        garbage record, an fsync or qmail-clean error) has its `new msg` logged
        before the warning, on every attempt."""
        todo_rel = rel("todo", n)
        info_rel = rel("info", n)
        try:
            fd = os.open(self.state.path(todo_rel), os.O_RDONLY)
        except OSError:
            raise QueueError("unable to open %s" % todo_rel)
        try:
            data = b""
            try:
                while True:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                raise QueueError("trouble reading %s" % todo_rel)
        finally:
            os.close(fd)
        mess_rel = rel("mess", n)
        try:
            mess_stat = os.stat(self.state.path(mess_rel))
        except FileNotFoundError:
            self._drop_ended_todo(n, mess_rel)
        except OSError:
            raise QueueError("unable to stat %s" % mess_rel)
        size = mess_stat.st_size
        fds = {}
        try:
            try:
                fds["info"] = self._create_info(n, info_rel)
            except OSError:
                raise QueueError("unable to create %s" % info_rel)
            if announce is not None:
                announce(logline.new_msg(n))
            uid = pid = 0
            sender = None
            info_data = bytearray()
            chan_data = {}
            for record in data.split(b"\0")[:-1]:
                kind = record[:1]
                if kind == b"u":
                    uid = envelope._decimal(record[1:])
                elif kind == b"p":
                    pid = envelope._decimal(record[1:])
                elif kind == b"F":
                    sender = record[1:]
                    info_data += record + b"\0"
                    if announce is not None:
                        announce(logline.info_msg(n, size, sender, pid, uid))
                elif kind == b"T":
                    channel, address = route(record[1:])
                    if channel not in chan_data:
                        channel_rel = rel(channel, n)
                        try:
                            fds[channel] = os.open(self.state.path(channel_rel),
                                                   os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                        except OSError:
                            raise QueueError("unable to create %s" % channel_rel)
                        chan_data[channel] = bytearray()
                    chan_data[channel] += b"T" + address + b"\0"
                else:
                    raise QueueError("unknown record type in %s" % todo_rel)
            self._write_all(fds["info"], info_data, info_rel)
            for channel in CHANNELS:
                if channel in chan_data:
                    self._write_all(fds[channel], chan_data[channel], rel(channel, n))
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        channels = tuple(c for c in CHANNELS if c in chan_data)
        if channels and hold_asked(mess_stat.st_mode):
            self.hold_asked.add(n)
        else:
            self.hold_asked.discard(n)
        return Preprocessed(n, sender, size, pid, uid, None, channels), fds

    @staticmethod
    def _write_all(fd, data, file_rel):
        try:
            write_all(fd, bytes(data))
        except OSError:
            raise QueueError("trouble writing to %s" % file_rel)
