"""The log's commit word when this boot cannot be identified (log backend, issue 29).

The commit word is never fsync'd and carries the boot that wrote it; after a power cut
a word from an earlier boot is not trusted (tests/test_logqueue_power_cut.py). Without
/proc (a chroot) the kernel's boot_id cannot be read. A fixed stand-in for it would
match the stale word an earlier boot without /proc left, and the next append would cut
the head back to that word's end: acknowledged, fsync'd records gone. An unknown boot
never trusts the word: the head's end is found in the segment itself.
(queue/log's own creation, fsync'd into queue/, is explored by
tests/test_crash_states.py, test_a_lost_log_directory_loses_its_segments.)
"""
import os

import pytest

from qmailpy.backends.log import commit as logcommit, records as R
from qmailpy.backends.log.commit import LogWriter, list_segments, segment_name


@pytest.fixture
def no_proc(monkeypatch, tmp_path):
    monkeypatch.setattr(logcommit, "BOOT_ID", str(tmp_path / "no-proc" / "boot_id"))
    monkeypatch.setattr(logcommit, "_boot", None)


def records(logdir):
    (seg,) = list_segments(logdir)
    with open(os.path.join(logdir, segment_name(seg)), "rb") as f:
        data = f.read()
    found, problems, _ = R.decode(data, seg)
    assert not problems
    return [r.n for r in found]


def test_without_proc_a_stale_commit_word_cuts_no_record(no_proc, tmp_path):
    logdir = str(tmp_path / "queue" / "log")
    os.makedirs(os.path.dirname(logdir))
    writer = LogWriter(logdir, 1 << 20)
    writer.append(R.encode_finish(1, 101, R.NOWHERE), durable=True)
    with open(os.path.join(logdir, "commit"), "rb") as f:
        stale = f.read()                 # as the disk may hold it after a power cut
    writer.append(R.encode_finish(2, 102, R.NOWHERE), durable=True)
    writer.append(R.encode_finish(3, 103, R.NOWHERE), durable=True)
    writer.close()
    with open(os.path.join(logdir, "commit"), "r+b") as f:
        f.write(stale)
    logcommit._boot = None               # the next boot's first process, again without /proc
    again = LogWriter(logdir, 1 << 20)
    again.append(R.encode_finish(4, 104, R.NOWHERE), durable=True)
    again.close()
    assert records(logdir) == [101, 102, 103, 104]

