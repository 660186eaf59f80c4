"""lock/tcpto: remember addresses whose connections time out (docs/delivery.md "tcpto logic"; docs/delivery.md "`lock/tcpto` format").

Up to 64 records of 16 bytes: IPv4 address (network order), error count
(0..10) in byte 4, time of the last error as a little-endian u32 in bytes
8..11. Every access holds an exclusive flock taken on a write-only descriptor.
qmail-remote works in QMAILHOME, so the path is queue/lock/tcpto; qmail-rspawn
clears the file at start from queue/mess.
"""
import fcntl
import os
import struct

PATH = "queue/lock/tcpto"
SIZE = 1024
RECORD = 16
MAX_COUNT = 10


def clean(path="../lock/tcpto"):
    """Overwrite the table with 1024 NULs (qmail-rspawn at start); silent on errors."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, bytes(SIZE))
    except OSError:
        pass
    finally:
        os.close(fd)


def _open_locked(path):
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
        data = os.read(fd, SIZE)
    except OSError:
        os.close(lockfd)
        return None, b""
    finally:
        os.close(fd)
    data = data[:len(data) // RECORD * RECORD]
    if not data:
        os.close(lockfd)
        return None, b""
    return lockfd, data


def _when(record):
    return struct.unpack_from("<I", record, 8)[0]


def _records(data):
    return [bytearray(data[i:i + RECORD]) for i in range(0, len(data), RECORD)]


class Table:
    """The tcpto checks of one qmail-remote run (it remembers whether the last
    address looked up was listed, as qmail's flagwasthere does)."""

    def __init__(self, path=PATH, now=None, pid=None):
        import time
        self.path = path
        self._now = now or (lambda: int(time.time()))
        self.pid = os.getpid() if pid is None else pid
        self.was_there = False

    def suppressed(self, ip):
        """True if ip timed out at least twice recently enough to skip it now."""
        self.was_there = False
        lockfd, data = _open_locked(self.path)
        if lockfd is None:
            return False
        os.close(lockfd)
        for record in _records(data):
            if bytes(record[:4]) == ip:
                self.was_there = True
                if record[4] >= 2:
                    return self._now() - _when(record) < ((60 + (self.pid & 31)) << 6)
                return False
        return False

    def record(self, ip, timed_out):
        """Note the outcome of a connection attempt to ip (after suppressed(ip))."""
        if not timed_out and not self.was_there:
            return
        lockfd, data = _open_locked(self.path)
        if lockfd is None:
            return
        try:
            records = _records(data)
            for i, record in enumerate(records):
                if bytes(record[:4]) != ip:
                    continue
                if not timed_out:
                    record[4] = 0
                else:
                    now = self._now()
                    if record[4] and now < 120 + _when(record):
                        return
                    record[4] = min(record[4] + 1, MAX_COUNT)
                    struct.pack_into("<I", record, 8, now & 0xFFFFFFFF)
                self._write(lockfd, i, record)
                return
            if not timed_out:
                return
            slot = next((i for i, r in enumerate(records) if not r[4]), None)
            if slot is None:
                slot = min(range(len(records)),
                           key=lambda i: (_when(records[i]) + (records[i][4] << 10), i))
            record = records[slot]
            record[:4] = ip
            struct.pack_into("<I", record, 8, self._now() & 0xFFFFFFFF)
            record[4] = 1
            self._write(lockfd, slot, record)
        finally:
            os.close(lockfd)

    @staticmethod
    def _write(lockfd, index, record):
        try:
            os.pwrite(lockfd, bytes(record), index * RECORD)
        except OSError:
            pass
