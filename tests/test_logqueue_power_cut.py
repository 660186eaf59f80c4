"""The commit word after a power cut (log backend).

queue/log/commit is written with pwrite and never fsync'd, while the segments are.
After a power cut the word on disk can be older than the segments: the state a disk
may hold is rebuilt here byte for byte (the segment as qmail-queue left it, fsync'd,
and the commit bytes as they were earlier, written in a boot that is no longer this
one). The next qmail-queue used to trust the stale end and truncate the segment to
it: three messages acknowledged, the fourth queued, and two envelopes were gone.
"""
import os
import struct

import pytest

from qmailpy.backends.log.commit import list_segments, segment_name
from queue_view import queued

BOOT_ID = "/proc/sys/kernel/random/boot_id"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.exists(BOOT_ID), reason="no kernel boot_id")]


def queue(home, i):
    done = home.queue_message(b"Subject: %d\n\nmessage %d\n" % (i, i), b"joe@test.example",
                              [b"r%d@test.example" % i])
    assert done.returncode == 0, done.stderr
    return done


def commit_path(home):
    return os.path.join(home.queue, "log", "commit")


def from_another_boot(commit):
    """commit bytes as the previous boot wrote them: its boot id is not this boot's."""
    return commit[:48] + struct.pack("<Q", 0x0123456789ABCDEF)


def queued_numbers(home):
    """Messages whose ENVELOPE the log holds (queue_view.queued: open_backend's reading)."""
    return len(queued(home))


@pytest.fixture
def log_home(qmail_home):
    qmail_home.control("queuebackend", "log\n")
    return qmail_home


def test_a_stale_commit_word_after_a_power_cut_loses_no_envelope(log_home):
    home = log_home
    queue(home, 1)
    with open(commit_path(home), "rb") as f:
        stale = f.read()
    queue(home, 2)
    queue(home, 3)
    logdir = os.path.join(home.queue, "log")
    (seg,) = list_segments(logdir)
    size = os.path.getsize(os.path.join(logdir, segment_name(seg)))
    with open(commit_path(home), "r+b") as f:
        f.write(from_another_boot(stale))
    queue(home, 4)
    assert os.path.getsize(os.path.join(logdir, segment_name(seg))) > size   # appended, not cut
    assert queued_numbers(home) == 4


def test_a_stale_head_after_a_power_cut_never_replaces_a_segment(log_home):
    """Rotation had made segment 2 (fsync'd, with acknowledged envelopes) but the word on
    disk still named segment 1: the next rotation must not recreate segment 2 empty."""
    home = log_home
    home.control("logsegmentsize", "4096\n")
    logdir = os.path.join(home.queue, "log")
    queue(home, 0)
    with open(commit_path(home), "rb") as f:
        stale = f.read()
    i = 1
    while len(list_segments(logdir)) < 2:
        queue(home, i)
        i += 1
    with open(commit_path(home), "r+b") as f:
        f.write(from_another_boot(stale))
    for j in range(i, i + 40):                   # enough to rotate again
        queue(home, j)
    assert queued_numbers(home) == i + 40


def test_within_one_boot_the_word_is_trusted(log_home):
    """Same boot id: a torn append beyond the word's end is cut off (a crashed appender),
    and the scan of the segments is not repeated."""
    home = log_home
    queue(home, 1)
    logdir = os.path.join(home.queue, "log")
    (seg,) = list_segments(logdir)
    path = os.path.join(logdir, segment_name(seg))
    with open(path, "ab") as f:
        f.write(b"QL\x01L\xff\xff\x00\x00torn")
    queue(home, 2)
    with open(path, "rb") as f:
        assert b"torn" not in f.read()
    assert queued_numbers(home) == 2
