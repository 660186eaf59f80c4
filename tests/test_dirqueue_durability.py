"""Preprocessing's promise on the directory backend: before qmail-clean is asked to
remove todo/n, info/S/n and the channel files are fsync'd and so are the split
directories holding their new entries (ext4/xfs keep a new entry across a power cut
only after an fsync of its directory)."""
import os

import pytest

from qmailpy.backends.dir.queue import DirQueue

pytestmark = [pytest.mark.slow, pytest.mark.dir_only]


class RecordingCleaner:
    """qmail-clean's side of the protocol in-process: note what was synced, then unlink."""

    def __init__(self, queue, synced):
        self.queue, self.synced, self.seen_at_request = queue, synced, []

    def request(self, name):
        self.seen_at_request.append((name, set(self.synced)))
        os.unlink(os.path.join(self.queue, name))
        return b"+"

    def request_many(self, names):
        return [self.request(name) for name in names]


def _route(addr):
    return ("local" if addr.endswith(b"@test.example") else "remote"), addr


@pytest.mark.parametrize("batch", [False, True])
def test_directories_are_synced_before_todo_is_cleaned(qmail_home, monkeypatch, batch):
    for rcpts in ([b"a@test.example", b"b@far.example"], [b"c@far.example"]):
        assert qmail_home.queue_message(b"Subject: x\n\nbody\n", b"s@x.example", rcpts).returncode == 0
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.path.relpath(os.readlink("/proc/self/fd/%d" % fd), qmail_home.queue))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    cleaner = RecordingCleaner(qmail_home.queue, synced)
    dq = DirQueue(qmail_home.path, cleaner=cleaner)
    numbers = dq.new_work()
    assert len(numbers) == 2
    if batch:
        results = dq.preprocess_batch(numbers, _route)
        assert all(not isinstance(r, Exception) for _, r in results)
    else:
        for n in numbers:
            dq.preprocess(n, _route)
    assert [name for name, _ in cleaner.seen_at_request] == ["todo/%d" % n for n in numbers]
    for (name, synced_then), n in zip(cleaner.seen_at_request, numbers):
        s = n % 23
        channels = ("local", "remote") if os.path.exists(os.path.join(qmail_home.queue, "local", str(s), str(n))) \
            else ("remote",)
        wanted = {"info/%d/%d" % (s, n), "info/%d" % s}
        wanted |= {"%s/%d/%d" % (c, s, n) for c in channels} | {"%s/%d" % (c, s) for c in channels}
        assert wanted <= synced_then, (name, sorted(wanted - synced_then))
