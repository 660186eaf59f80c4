"""How qmail-send finds the messages of a command on the log backend (qmailpy/backends/
log/locator.py): a walk of the log in steps while qmail-send goes on changing the log, and
the command file's numbers as qmail-send reads them (qmailpy/command.py)."""
import io
import os
from array import array

import pytest

from qmailpy import command
from qmailpy.backends.log import records as R
from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.queue import LogQueue

from logqueue_harness import make_queue, route


def _waiting_messages(tmp_path, count):
    """A log with `count` preprocessed messages, each deferred (a REPLACEMENT), checkpointed."""
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    numbers = [enqueue(queue, b"Subject: %d\n\nhi\n" % i, b"joe@a.example", [b"bob%d@b.example" % i])
               for i in range(count)]
    lq = LogQueue(home)
    lq.startup()
    for n in lq.new_work():
        lq.preprocess(n, route)
        lq.reschedule(n, "remote", 2 ** 31)
    lq.checkpoint(force=True)
    return lq, sorted(numbers)


def _newest_snapshots(lq):
    """{n: position of its newest snapshot} by a full read of the log."""
    return {n: m["rec"].pos for n, m in lq.latest_states().items() if m["rec"].type in R.SNAPSHOTS}


def test_a_walk_in_steps_follows_what_qmail_send_writes_meanwhile(tmp_path):
    lq, numbers = _waiting_messages(tmp_path, 40)
    try:
        wanted = array("Q", numbers[::2])
        locator = lq.locate(wanted)
        assert locator.step(budget=25) is False              # part of the way
        # Messages behind the walk and ahead of it change: a REPLACEMENT each (hold,
        # requeue) and a FINISH (delete), appended at the head while the walk is on.
        behind, ahead, deleted = wanted[1], wanted[-2], wanted[-1]
        assert lq.take([behind, ahead, deleted], locator=None) == ([behind, ahead, deleted], [])
        for n in (behind, ahead, deleted):
            assert lq.bring(n)
        lq.hold(behind)
        lq.requeue(ahead, 12345)
        lq.delete(deleted)
        for n in (behind, ahead):
            lq.let_go(n)
        steps = 1
        while not locator.step(budget=25):
            steps += 1
        assert steps > 2
        newest = _newest_snapshots(lq)
        assert deleted not in newest
        for n in wanted:
            assert locator.where(n) == newest.get(n), n
        for n in numbers[1::2]:                               # not asked for: not kept
            assert locator.where(n) is None
        # after the walk, qmail-send's own appends still move them
        assert lq.take([behind], locator) == ([behind], [])
        assert lq.bring(behind)
        lq.release(behind)
        lq.let_go(behind)
        assert locator.where(behind) == _newest_snapshots(lq)[behind] != newest[behind]
        lq.forget(locator)
        assert lq.state.locators == []
    finally:
        lq.close()


def test_a_locator_costs_bytes_per_number_not_records(tmp_path):
    lq, numbers = _waiting_messages(tmp_path, 3)
    try:
        wanted = array("Q", range(10 ** 6, 10 ** 6 + 100000))
        locator = lq.locate(wanted)
        while not locator.step():
            pass
        size = sum(a.itemsize * len(a) for a in (locator.numbers, locator.segs, locator.offs, locator.kinds))
        assert size == 100000 * 25
        assert all(locator.where(n) is None for n in numbers)
    finally:
        lq.close()


def test_command_numbers_are_read_in_order_without_repeats():
    cmd = command.read(io.BytesIO(b"action delete\nmsg 9\nmsg 3\nmsg 9\nmsg 18446744073709551615\n"))
    assert cmd.action == "delete" and list(cmd.numbers) == [3, 9, 2 ** 64 - 1]
    assert isinstance(cmd.numbers, array)
    for data, why in ((b"action hold\nmsg 18446744073709551616\n", "unknown line 'msg 18446744073709551616'"),
                      (b"action hold\nmsg 1", "incomplete last line"),
                      (b"action hold\nmsg \xff\n", "not ASCII"),
                      (b"msg 1\n", "no action"),
                      (b"action bounce\nmsg 1\n", "a reason belongs to bounce, and bounce needs one")):
        with pytest.raises(command.CommandError) as e:
            command.read(io.BytesIO(data))
        assert str(e.value) == why


def test_a_reply_is_appended_as_it_goes_and_appears_whole(tmp_path):
    reply = command.ReplyWriter(str(tmp_path), "c1")
    reply.FLUSH = 40                                          # a few lines at a time
    for n in range(1, 11):
        reply.add(n, command.DONE if n % 3 else command.NONE, "deleted" if n % 3 else "not in queue")
    assert os.listdir(tmp_path) == [".c1.reply"]              # written so far, not yet the reply
    assert 0 < os.path.getsize(tmp_path / ".c1.reply") < 10 * len(b"10 done deleted\n")
    reply.finish()
    assert os.listdir(tmp_path) == ["c1.reply"]
    with open(tmp_path / "c1.reply", "rb") as f:
        answers = list(command.decode_reply(f))
    assert answers == [(n, "done" if n % 3 else "none", "deleted" if n % 3 else "not in queue")
                       for n in range(1, 11)]


def test_batches_take_the_numbers_split_by_split():
    """qmail-send's batches (send/commands.py): each holds numbers of one split directory
    (n % 23), so the directory backend syncs one directory per channel for a batch; every
    number comes once."""
    from qmailpy.send.commands import CommandDesk, Open
    desk = CommandDesk(None)
    desk.batch = 3
    op = Open("c", command.Command("delete", array("Q", range(1000, 1100))), "command")
    batches = []
    while op.split < 23:
        batches.append(desk._next_batch(op))
    batches = [b for b in batches if b]
    assert all(len({n % 23 for n in b}) == 1 and len(b) <= 3 for b in batches)
    assert [n % 23 for b in batches for n in b] == sorted(n % 23 for n in range(1000, 1100))
    assert sorted(n for b in batches for n in b) == list(range(1000, 1100))
