"""A garbage flag that cannot be written stays owed, and no checkpoint skips past it.

The checkpoint writes each superseded record's flag in place, then records where
recovery starts. A flag whose write failed (EIO) reads live on disk: had the
checkpoint forgotten it and moved recovery's start past it, a restart would take the
superseded snapshot for live and offer a finished message again.
"""
import errno
import os
import time

from qmailpy.backends.log import records as R
from qmailpy.backends.log import recovery as logrecovery
from qmailpy.backends.log.commit import segment_name
from qmailpy.backends.log.enqueue import enqueue

from logqueue_harness import make_queue, started


def checkpoint_bytes(home):
    path = os.path.join(home, "queue", "log", logrecovery.CHECKPOINT)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def test_a_flag_not_written_is_kept_and_puts_the_checkpoint_off(tmp_path, monkeypatch):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    n = enqueue(queue, b"m\n", b"s@x.example", [b"r@r.example"])
    t = int(time.time())
    lq = started(home)
    lq.mark_done(n, "remote", lq.recipients(n, "remote")[0])
    lq.finish_channel(n, "remote")
    lq.complete(n)
    owed = set(lq.state.garbage)
    assert owed                               # its ENVELOPE/snapshots are superseded
    before = checkpoint_bytes(home)

    real_pwrite = os.pwrite

    def failing_flags(fd, data, offset):
        if bytes(data) == bytes((R.GARBAGE,)):
            raise OSError(errno.EIO, "Input/output error")
        return real_pwrite(fd, data, offset)
    monkeypatch.setattr(logrecovery.os, "pwrite", failing_flags)
    lq.checkpoint(force=True, now=t + 10)
    assert lq.state.garbage == owed                 # still owed, still superseded in memory
    assert checkpoint_bytes(home) == before   # recovery's start did not move past them

    monkeypatch.setattr(logrecovery.os, "pwrite", real_pwrite)
    lq.checkpoint(force=True, now=t + 20)
    assert lq.state.garbage == set()
    assert checkpoint_bytes(home) != before
    for seg, offset in owed:                  # the flags now read garbage on disk
        path = os.path.join(queue, "log", segment_name(seg))
        with open(path, "rb") as f:
            f.seek(offset + R.FLAGS_OFFSET)
            assert f.read(1) == bytes((R.GARBAGE,))
