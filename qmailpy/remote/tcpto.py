"""lock/tcpto and lock/tcpto6: remember addresses whose connections time out (docs/delivery.md "tcpto logic"; docs/delivery.md "`lock/tcpto` format").

lock/tcpto is qmail's: up to 64 records of 16 bytes: IPv4 address (network
order), error count (0..10) in byte 4, time of the last error as a
little-endian u32 in bytes 8..11. IPv6 addresses live in lock/tcpto6, records
of 32 bytes: the address in bytes 0..15, the count in byte 16, the time in
bytes 24..27; so a real qmail reading lock/tcpto never sees an IPv6 address
there (its first 4 bytes would pass for an IPv4 one). Every access holds an
exclusive flock taken on a write-only descriptor. qmail-remote works in
QMAILHOME, so the paths are queue/lock/tcpto{,6}; qmail-rspawn clears both at
start from queue/mess.
"""
import fcntl
import os
import struct

PATH = "queue/lock/tcpto"
SIZE = 1024
RECORD = 16
MAX_COUNT = 10


class Layout:
    """Where the fields of one family's records are."""

    def __init__(self, suffix, addr_len, record, count_at, when_at):
        self.suffix, self.addr_len, self.record = suffix, addr_len, record
        self.count_at, self.when_at = count_at, when_at
        self.size = 64 * record


IPV4 = Layout("", 4, RECORD, 4, 8)
IPV6 = Layout("6", 16, 32, 16, 24)


def clean(path="../lock/tcpto", layout=IPV4):
    """Overwrite the table with NULs (qmail-rspawn at start, for each of path and path + '6');
    silent on errors."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, bytes(layout.size))
    except OSError:
        pass
    finally:
        os.close(fd)


def _open_locked(path, layout):
    """(lock fd, table bytes) or (None, b'') — the lock fd stays open and locked."""
    try:
        lockfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None, b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        os.close(lockfd)
        return None, b""
    try:
        fcntl.flock(lockfd, fcntl.LOCK_EX)
        data = os.read(fd, layout.size)
    except OSError:
        os.close(lockfd)
        return None, b""
    finally:
        os.close(fd)
    data = data[:len(data) // layout.record * layout.record]
    if not data:
        os.close(lockfd)
        return None, b""
    return lockfd, data


def _records(data, layout):
    return [bytearray(data[i:i + layout.record]) for i in range(0, len(data), layout.record)]


class Table:
    """The tcpto checks of one qmail-remote run (it remembers whether the last
    address looked up was listed, as qmail's flagwasthere does). An IPv6
    address goes to path + '6'."""

    def __init__(self, path=PATH, now=None, pid=None):
        import time
        self.path = path
        self._now = now or (lambda: int(time.time()))
        self.pid = os.getpid() if pid is None else pid
        self.was_there = False

    def _file(self, ip):
        layout = IPV6 if len(ip) == 16 else IPV4
        return self.path + layout.suffix, layout

    def suppressed(self, ip):
        """True if ip timed out at least twice recently enough to skip it now."""
        self.was_there = False
        path, lay = self._file(ip)
        lockfd, data = _open_locked(path, lay)
        if lockfd is None:
            return False
        os.close(lockfd)
        for record in _records(data, lay):
            if bytes(record[:lay.addr_len]) == ip:
                self.was_there = True
                if record[lay.count_at] >= 2:
                    when = struct.unpack_from("<I", record, lay.when_at)[0]
                    return self._now() - when < ((60 + (self.pid & 31)) << 6)
                return False
        return False

    def record(self, ip, timed_out):
        """Note the outcome of a connection attempt to ip (after suppressed(ip))."""
        if not timed_out and not self.was_there:
            return
        path, lay = self._file(ip)
        lockfd, data = _open_locked(path, lay)
        if lockfd is None:
            return
        count, at = lay.count_at, lay.when_at

        def when(record):
            return struct.unpack_from("<I", record, at)[0]

        def write(index, record):
            try:
                os.pwrite(lockfd, bytes(record), index * lay.record)
            except OSError:
                pass
        try:
            records = _records(data, lay)
            for i, record in enumerate(records):
                if bytes(record[:lay.addr_len]) != ip:
                    continue
                if not timed_out:
                    record[count] = 0
                else:
                    now = self._now()
                    if record[count] and now < 120 + when(record):
                        return
                    record[count] = min(record[count] + 1, MAX_COUNT)
                    struct.pack_into("<I", record, at, now & 0xFFFFFFFF)
                write(i, record)
                return
            if not timed_out:
                return
            slot = next((i for i, r in enumerate(records) if not r[count]), None)
            if slot is None:
                slot = min(range(len(records)),
                           key=lambda i: (when(records[i]) + (records[i][count] << 10), i))
            record = records[slot]
            record[:lay.addr_len] = ip
            struct.pack_into("<I", record, at, self._now() & 0xFFFFFFFF)
            record[count] = 1
            write(slot, record)
        finally:
            os.close(lockfd)


class AccessError(Exception):
    """qmail-tcpto / qmail-tcpok could not do `stage` ('open', 'lock', 'read', 'clear') to the table."""

    def __init__(self, stage, error):
        super().__init__("%s: %s" % (stage, error))
        self.stage, self.error = stage, error


def _open(name, dir_fd, flags):
    """name in the directory dir_fd, never through a symlink, a FIFO or a linked file: root
    runs qmail-tcpto and qmail-tcpok in queue/lock, which another account owns."""
    from qmailpy import nofollow
    return nofollow.open_file(name, dir_fd, flags)


def listed(name, dir_fd, layout=IPV4):
    """[(address bytes, count, time of the last timeout)] of the records with a count of 1 or
    more, read under the lock as qmail-tcpto does."""
    fds = []
    try:
        stage = "open"
        fds.append(_open(name, dir_fd, os.O_WRONLY))
        fds.append(_open(name, dir_fd, os.O_RDONLY))
        stage = "lock"
        fcntl.flock(fds[0], fcntl.LOCK_EX)
        stage = "read"
        data = os.read(fds[1], layout.size)
    except OSError as e:
        raise AccessError(stage, e) from e
    finally:
        for fd in fds:
            os.close(fd)
    found = []
    for record in _records(data[:len(data) // layout.record * layout.record], layout):
        if record[layout.count_at] >= 1:
            found.append((bytes(record[:layout.addr_len]), record[layout.count_at],
                          struct.unpack_from("<I", record, layout.when_at)[0]))
    return found


def clear(name, dir_fd, layout=IPV4):
    """Overwrite the table with NULs under the lock (qmail-tcpok), reporting failures."""
    stage = "open"
    try:
        fd = _open(name, dir_fd, os.O_WRONLY)
    except OSError as e:
        raise AccessError(stage, e) from e
    try:
        stage = "lock"
        fcntl.flock(fd, fcntl.LOCK_EX)
        stage = "clear"
        from qmailpy.fileio import write_all
        write_all(fd, bytes(layout.size))
    except OSError as e:
        raise AccessError(stage, e) from e
    finally:
        os.close(fd)
