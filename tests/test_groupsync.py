"""Directory fsyncs shared by processes that link into one directory at once (qmailpy.groupsync)."""
import fcntl
import os
import struct
import time

from qmailpy.groupsync import DirSyncs

TIMEOUT = 30


def counters(syncs, slot):
    return struct.unpack("<QQ", os.pread(syncs.fd, 16, slot * 16))


def blocked_on_locks():
    """Processes waiting for a POSIX record lock, as /proc/locks lists them ('->' lines)."""
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and "POSIX" in line)


def test_links_made_while_a_sync_runs_share_the_next_one(tmp_path):
    syncs = DirSyncs(2)
    offset = 0
    fcntl.lockf(syncs.fd, fcntl.LOCK_EX, 1, offset)      # as if an fsync of slot 0 were running
    before = blocked_on_locks()
    children = []
    for k in range(5):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with open(tmp_path / ("m%d" % k), "w"):
                    pass
                syncs.sync(0, str(tmp_path))
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    deadline = time.monotonic() + TIMEOUT
    # a process blocking on a lock raises no event (inotify, a pipe) one could wait on, so
    # /proc/locks is read until the five waiters show there, within the deadline
    while blocked_on_locks() < before + 5:              # every child linked and is waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fcntl.lockf(syncs.fd, fcntl.LOCK_UN, 1, offset)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    assert counters(syncs, 0) == (1, 1)                 # five links, one fsync
    assert counters(syncs, 1) == (0, 0)                 # another directory's slot untouched


def test_a_link_after_a_sync_began_gets_its_own(tmp_path):
    syncs = DirSyncs(1)
    for k in range(3):
        with open(tmp_path / ("m%d" % k), "w"):
            pass
        syncs.sync(0, str(tmp_path))
    assert counters(syncs, 0) == (3, 3)
    assert (syncs.made, syncs.shared) == (3, 0)
