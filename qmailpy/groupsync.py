"""Directory fsyncs shared by processes that link into the same directory at the same time.

qmail-qmqpd's queueing workers each link a new todo/n (and mess/S/n) and must
fsync the directory before they answer (qmailpy.fileio.fsync_dir). When several
link at once, one fsync of the directory started after all their links makes all
of them durable: this is the directory backend's group commit, the same rule as
the log backend's (qmailpy.backends.log.commit).

The workers share a small file that their server opened before forking them (an
unlinked temporary file, so nothing is left in the queue): for each directory
slot, two little-endian u64s, `started` (fsyncs begun) and `completed` (the
number of the last fsync that finished), each slot with its own fcntl record
lock, so that syncs of different directories never wait for each other.

sync(slot, path), after the caller's link: read `started` as `mine`; any fsync
numbered above `mine` begins after this read, so after the link. Take the slot's
lock; if `completed` > `mine`, such an fsync has finished: the link is durable,
nothing to do. Otherwise begin fsync number `started + 1`, fsync the directory
and record it as `completed`. Syncs of one slot run one at a time, in order, so
`completed` only grows. After a power cut the numbers mean nothing, and the rule
still holds: a stale `completed` is never above a fresh `started`.
"""
import fcntl
import os
import struct
import tempfile

from qmailpy.fileio import fsync_dir

_SLOT = struct.Struct("<QQ")


class DirSyncs:
    def __init__(self, slots):
        fd, path = tempfile.mkstemp(prefix="qmailpy-dirsync-")
        os.unlink(path)
        os.ftruncate(fd, slots * _SLOT.size)
        self.fd = fd
        self.slots = slots
        self.made = self.shared = 0     # fsyncs this process made, and those it was spared

    def sync(self, slot, path):
        """Make the entries linked into directory path before this call durable."""
        offset = slot * _SLOT.size
        mine = _SLOT.unpack(os.pread(self.fd, _SLOT.size, offset))[0]
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, offset)
        try:
            started, completed = _SLOT.unpack(os.pread(self.fd, _SLOT.size, offset))
            if completed > mine:
                self.shared += 1
                return
            number = started + 1
            os.pwrite(self.fd, _SLOT.pack(number, completed), offset)
            fsync_dir(path)
            os.pwrite(self.fd, _SLOT.pack(number, number), offset)
            self.made += 1
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, offset)
