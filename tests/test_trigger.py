"""lock/trigger: pulling never blocks; a listening reader becomes readable (docs/protocols.md "Trigger (`lock/trigger`)")."""
import os
import select
import subprocess
import sys

import pytest

from qmailpy import trigger


def test_pull_without_reader_returns_at_once(qmail_home):
    code = ("import sys; from qmailpy import trigger; "
            "sys.exit(0 if trigger.pull(sys.argv[1]) is False else 1)")
    done = subprocess.run([sys.executable, "-c", code, qmail_home.queue], timeout=30)
    assert done.returncode == 0


def test_qmail_queue_without_reader_still_succeeds(qmail_home):
    assert qmail_home.queue_message(b"m\n", b"a@b", [b"c@d"]).returncode == 0


def test_pull_wakes_a_reader(qmail_home):
    fd = trigger.open_reader(qmail_home.queue)
    try:
        assert select.select([fd], [], [], 0)[0] == []        # a fresh read end is not readable
        assert trigger.pull(qmail_home.queue) is True
        assert select.select([fd], [], [], 30)[0] == [fd]
        assert os.read(fd, 10) == b"\0"
        fd = trigger.reopen_reader(qmail_home.queue, fd)
        assert select.select([fd], [], [], 0)[0] == []        # reopening discards the wake-up
    finally:
        os.close(fd)


def test_qmail_queue_pulls_the_trigger(qmail_home):
    fd = trigger.open_reader(qmail_home.queue)
    try:
        assert qmail_home.queue_message(b"m\n", b"a@b", [b"c@d"]).returncode == 0
        assert select.select([fd], [], [], 30)[0] == [fd]
        assert os.read(fd, 10) == b"\0"
    finally:
        os.close(fd)


def test_failed_queueing_does_not_pull(qmail_home):
    fd = trigger.open_reader(qmail_home.queue)
    try:
        assert qmail_home.queue_message(b"m\n", b"a" * 2000, [b"c@d"]).returncode == 11
        assert select.select([fd], [], [], 0)[0] == []
    finally:
        os.close(fd)


@pytest.mark.slow
def test_pull_with_full_pipe_does_not_block(qmail_home):
    fd = trigger.open_reader(qmail_home.queue)
    try:
        for _ in range(70000):                                 # more than the 64 KiB pipe buffer
            trigger.pull(qmail_home.queue)
        assert len(os.read(fd, 1 << 20)) >= 4096
    finally:
        os.close(fd)
