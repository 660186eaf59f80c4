"""Appending records to the log backend's segments, with group commit.

Every process that writes the log (each qmail-queue, and qmail-send) shares three
small files in queue/log/:

  lock    flock(2)ed exclusively around every append and every rotation
  sync    flock(2)ed exclusively by whoever is checking or making durability
  commit  56 bytes, seven little-endian u64s:
            [0]  head       number of the segment appends go to
            [8]  end        offset just after the last complete append in head
            [16] synced_seg \\ everything up to (synced_seg, synced_end) is on
            [24] synced_end /  disk (fsync'd); compared as a pair
            [32] fsyncs     how many commit fsyncs were made (for benchmarks)
            [40] rotations  how many rotations (each one fsync) were made
            [48] boot       the boot (kernel boot_id) that wrote head/end
          head/end/rotations/boot are only read or written under `lock`, synced_*
          and fsyncs only under `sync`, so no reader ever sees a torn value.

The commit word is written with pwrite and never fsync'd: within one boot the page
cache makes it exact. After a power cut it may be older than the segments, which
are fsync'd, so the first appender of a new boot (its boot id differs from the
word's) does not trust it: head becomes the newest segment, end the offset after
its last checksum-valid record (what a torn append left beyond is cut off), and the
word is rewritten with this boot's id. Trusting a stale end would truncate records
that were acknowledged; a stale head would let rotation replace a segment. Rotation
never truncates an existing segment (O_EXCL).

Append (under `lock`): if the head segment is longer than `end` a previous
appender died mid-write, so cut it back to `end`; write the record at `end`;
advance `end`. The appender remembers (head, end-after-its-record).

Make durable (group commit): take `sync`. If synced >= my position, someone else's
fsync already covered my record: done, no fsync. Otherwise read (head, end) under
`lock` (lock order is always sync -> lock, rotation takes only lock), fsync the
head segment and store synced = (head, end): that covers every append finished
before the read, so every writer that queued up on `sync` meanwhile finds itself
covered. N concurrent writers therefore share far fewer than N fsyncs.

Rotation (under `lock`, when a record would push the head past the size limit):
fsync the old head, create the next segment with its header, fsync it and the
directory, then point head at it. A writer whose segment was rotated away is
durable (rotation fsync'd it); it records synced = (new head, header size).
"""
import errno
import fcntl
import os
import struct

from qmailpy.backends.log.records import HEADER_SIZE, segment_header, valid_end
from qmailpy.fileio import fsync_dir

LOG_DIR = "log"
SEGMENT_LIMIT = 64 * 1024 * 1024
SEGMENT_LIMIT_CONTROL = "logsegmentsize"
MIN_SEGMENT_LIMIT = 4096
_COMMIT = struct.Struct("<QQQQQQQ")
BOOT_ID = "/proc/sys/kernel/random/boot_id"


UNKNOWN_BOOT = 0            # never written by a known boot: a word carrying it is never trusted
_boot = None


def boot_id():
    """This boot's id as a u64 (the first 16 hex digits of the kernel's boot_id; never 0),
    read once per process: no process outlives its boot. UNKNOWN_BOOT when the kernel's
    boot_id cannot be read (no /proc, as in a chroot): the commit word is then never
    trusted (every append finds the head's end by reading the head segment), since a
    fixed stand-in would match a stale word written before a power cut."""
    global _boot
    if _boot is None:
        try:
            with open(BOOT_ID, "rb") as f:
                _boot = int(f.read(36).replace(b"-", b"")[:16], 16) or 1
        except (OSError, ValueError):
            _boot = UNKNOWN_BOOT
    return _boot


COMMIT_SIZE = _COMMIT.size
FILE_MODE = 0o660


def segment_name(number):
    return "%010d.seg" % number


def segment_number(name):
    """Number of a segment file name, or None for anything else in log/."""
    if len(name) == 14 and name.endswith(".seg") and name[:10].isdigit():
        return int(name[:10])
    return None


def list_segments(logdir):
    try:
        names = os.listdir(logdir)
    except FileNotFoundError:
        return []
    return sorted(n for n in map(segment_number, names) if n is not None)


def _open_rw(path, create=True):
    # O_NOFOLLOW: log/ is qmailq's, and qmailctl convert runs this as root (a symlink at
    # log/commit had root write the commit word into the linked file)
    flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, FILE_MODE)
    if create:
        _share(fd)
    return fd


def _share(fd):
    """Group read-write whatever the umask (qmail-queue runs with 033, qmail-send 077):
    qmail-queue (qmailq) and qmail-send (qmails) append to and flag each other's files."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and st.st_mode & 0o777 != FILE_MODE:
        os.fchmod(fd, FILE_MODE)


def read_segment_limit(control_path):
    """The segment size limit in control_path (control/logsegmentsize: bytes, by
    qmail's integer rule, qmailpy.home.readint); SEGMENT_LIMIT when absent, 0 or
    without leading digits; at least MIN_SEGMENT_LIMIT. One small read: qmail-queue
    calls this."""
    from qmailpy.home import first_line, readint
    try:
        with open(control_path, "rb") as f:
            data = f.read(64)
    except OSError:
        return SEGMENT_LIMIT
    value = readint(first_line(data), 0)
    if value <= 0:
        return SEGMENT_LIMIT
    return max(value, MIN_SEGMENT_LIMIT)


class LogWriter:
    """One process's handle on the log: append records, make them durable.

    segment_limit None: read control/logsegmentsize of the home whose queue/log
    logdir is (logdir/../../control), as every writer of one queue must agree."""

    def __init__(self, logdir, segment_limit=None):
        self.logdir = logdir
        try:
            os.mkdir(logdir)
            os.chmod(logdir, 0o2770)         # qmailq and qmails share it (group qmail)
            # durable in queue/ before anything in it is: a lost log/ loses every segment
            fsync_dir(os.path.dirname(os.path.abspath(logdir)))
        except FileExistsError:
            pass
        if segment_limit is None:
            segment_limit = read_segment_limit(
                os.path.join(logdir, os.pardir, os.pardir, "control", SEGMENT_LIMIT_CONTROL))
        self.segment_limit = segment_limit
        self.lock_fd = _open_rw(os.path.join(logdir, "lock"))
        self.sync_fd = _open_rw(os.path.join(logdir, "sync"))
        self.commit_fd = _open_rw(os.path.join(logdir, "commit"))
        self._segments = {}              # number -> fd
        self.fsyncs = 0                  # fsyncs made by this process

    def close(self):
        for fd in [self.lock_fd, self.sync_fd, self.commit_fd, *self._segments.values()]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._segments.clear()

    # -- the commit word ---------------------------------------------------
    def _read_commit(self):
        data = os.pread(self.commit_fd, COMMIT_SIZE, 0)
        if len(data) < COMMIT_SIZE:
            data = data.ljust(COMMIT_SIZE, b"\0")
        return list(_COMMIT.unpack(data))

    def _write_head(self, head, end):
        os.pwrite(self.commit_fd, struct.pack("<QQ", head, end), 0)

    def _this_boot(self, commit):
        """(head, end) to append at, under `lock`: the word's own within the boot that
        wrote it; in a new boot, the true end recovered from the segments (see above)."""
        boot = boot_id()
        if boot != UNKNOWN_BOOT and commit[6] == boot:
            return commit[0], commit[1]
        segments = list_segments(self.logdir)
        head = segments[-1] if segments else 0
        end = HEADER_SIZE
        if head:
            fd = self.segment_fd(head)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            end = valid_end(data) if len(data) >= HEADER_SIZE else HEADER_SIZE
            if len(data) < HEADER_SIZE:
                os.pwrite(fd, segment_header(head), 0)
                os.fsync(fd)
            elif len(data) != end:
                os.ftruncate(fd, end)
        self._write_head(head, end)
        os.pwrite(self.commit_fd, struct.pack("<Q", boot), 48)
        return head, end

    def _write_rotations(self, count):
        os.pwrite(self.commit_fd, struct.pack("<Q", count), 40)

    def _write_synced(self, seg, end, fsyncs):
        os.pwrite(self.commit_fd, struct.pack("<QQQ", seg, end, fsyncs), 16)

    def head(self):
        """(head segment, append end) read under the append lock (recovered first in a new boot)."""
        with _Flock(self.lock_fd):
            return self._this_boot(self._read_commit())

    def total_fsyncs(self):
        """fsyncs made by every writer of this log so far (commits + rotations)."""
        with _Flock(self.sync_fd):
            commits = self._read_commit()[4]
        with _Flock(self.lock_fd):
            return commits + self._read_commit()[5]

    # -- segments ------------------------------------------------------------
    def segment_fd(self, number):
        fd = self._segments.get(number)
        if fd is None:
            fd = _open_rw(os.path.join(self.logdir, segment_name(number)), create=False)
            self._segments[number] = fd
        return fd

    def forget_segment(self, number):
        fd = self._segments.pop(number, None)
        if fd is not None:
            os.close(fd)

    def _create_segment(self, number):
        path = os.path.join(self.logdir, segment_name(number))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
        _share(fd)
        header = segment_header(number)
        os.pwrite(fd, header, 0)
        os.fsync(fd)
        fsync_dir(self.logdir)
        self._segments[number] = fd
        return fd

    def _fsync(self, fd):
        os.fsync(fd)
        self.fsyncs += 1

    # -- appending -------------------------------------------------------------
    def append(self, data, durable=False):
        """Write one or more framed records; their (segment, offset) start.

        With durable=True the call returns only once they are on disk."""
        with _Flock(self.lock_fd):
            head, end = self._this_boot(self._read_commit())
            if head == 0:
                head = max(list_segments(self.logdir) or [0]) + 1
                self._create_segment(head)
                end = HEADER_SIZE
            elif end + len(data) > self.segment_limit and end > HEADER_SIZE:
                self._fsync(self.segment_fd(head))
                self._write_rotations(self._read_commit()[5] + 1)
                head += 1
                self._create_segment(head)
                end = HEADER_SIZE
            fd = self.segment_fd(head)
            if os.fstat(fd).st_size != end:
                os.ftruncate(fd, end)        # a dead appender's partial record
            _pwrite_all(fd, data, end)
            start, end = end, end + len(data)
            self._write_head(head, end)
        if durable:
            self.sync_to(head, end)
        return head, start

    def sync_to(self, seg, end):
        """Make everything up to (seg, end) durable, sharing fsyncs with other writers.

        Returns True when this call made an fsync, False when it was already covered."""
        with _Flock(self.sync_fd):
            c = self._read_commit()
            synced_seg, synced_end, count = c[2], c[3], c[4]
            if (synced_seg, synced_end) >= (seg, end):
                return False
            with _Flock(self.lock_fd):
                head, head_end = self._read_commit()[:2]
            if head == 0:
                return False                 # nothing was ever appended
            if head > seg:
                # rotation fsync'd our segment; the new head's header is durable too
                self._write_synced(head, HEADER_SIZE, count)
                return False
            self._fsync(self.segment_fd(head))
            self._write_synced(head, head_end, count + 1)
            return True

    def sync_all(self):
        """fsync the head up to its current end (qmail-send's checkpoints)."""
        head, end = self.head()
        if head:
            self.sync_to(head, end)
        return head, end

    def reset_end(self, head, end):
        """Recovery: the head really ends at `end` (caller holds the append lock)."""
        fd = self.segment_fd(head)
        if os.fstat(fd).st_size != end:
            os.ftruncate(fd, end)
        self._write_head(head, end)
        os.pwrite(self.commit_fd, struct.pack("<Q", boot_id()), 48)

    def locked(self):
        """Context manager holding the append lock (recovery, conversion)."""
        return _Flock(self.lock_fd)


def _pwrite_all(fd, data, offset):
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[done:]
        offset += done


class _Flock:
    __slots__ = ("fd",)

    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False
