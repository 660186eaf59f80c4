"""qmailctl convert carries qmailctl queue hold over, both ways (docs/log-queue.md "Held
messages", queue-format.md "hold/n"): a held message stays held on the new backend, and
the directory backend's markers leave with the rest of its queue."""
import os
import subprocess

import pytest

from convert_support import build_dir_queue, envelope_files
from qmailpy.backends.dir.queue import DirQueue
from qmailpy.backends.log.queue import LogQueue
from qmailpy.send.clean import CleanClient

pytestmark = pytest.mark.slow


def _convert(home, to):
    done = home.run(["qmailctl", "convert", "--to", to, "--home", home.path])
    assert done.returncode == 0, done.stderr


def test_convert_keeps_holds_both_ways(qmail_home):
    queue = qmail_home.queue
    ns = build_dir_queue(qmail_home)
    held = ns[2]                                        # preprocessed, nothing done yet
    clean = subprocess.Popen(["qmail-clean"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=qmail_home.env)
    try:
        dq = DirQueue(qmail_home.path, cleaner=CleanClient(clean.stdin.fileno(), clean.stdout.fileno()))
        dq.hold(held)
    finally:
        clean.stdin.close()
        clean.wait(timeout=30)
    marker = os.path.join(queue, "hold", str(held))
    with open(marker, "rb") as f:
        mark = f.read()
    before = envelope_files(queue)

    _convert(qmail_home, "log")
    assert os.listdir(os.path.join(queue, "hold")) == []
    lq = LogQueue(qmail_home.path)
    try:
        latest = lq.latest_states()
        assert [n for n in ns[:3] if latest[n]["rec"].held] == [held]
    finally:
        lq.close()

    _convert(qmail_home, "dir")
    assert envelope_files(queue) == before
    assert os.listdir(os.path.join(queue, "hold")) == [str(held)]
    with open(marker, "rb") as f:
        assert f.read() == mark
