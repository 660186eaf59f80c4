"""No poison message (issue 23): qmail-send never dies of one message (docs/qmail-send.md
"Messages set aside"), and `qmailctl queue delete` removes a message also while qmail-send is
down (docs/queue-operations.md "Deleting while qmail-send is down"). The envelope limits that
keep new messages from getting there: tests/test_queue_limits.py."""
import json
import os
import re

import pytest

from queue_view import leftovers, queued
from send_harness import Daemons, wait_mess_gone

pytestmark = pytest.mark.slow

MSG = b"Subject: test\n\nhello\n"
# Accepted by qmail-queue (within qmailpy/queuelimits.py's byte bound: 5000 one-byte
# recipients, no count cap), but each gets '@' + envnoathost, far beyond the rewriting
# the bound allows for: 5000 x 14 kB does not fit one PREPROCESSED record (64 MiB).
RECIPIENTS = 5000
ENVNOATHOST = "h" * 14000 + ".example"


@pytest.fixture
def daemons(qmail_home):
    d = Daemons(qmail_home, fake=True)
    yield d
    d.kill()


def delete(home, *numbers):
    return home.run(["qmailctl", "queue", "delete", "--home", home.path, "--timeout", "20"]
                    + [str(n) for n in numbers])


def listed_set_aside(home):
    """(n, why) of each message `qmailctl queue list --state set-aside --json` lists."""
    got = home.run(["qmailctl", "queue", "list", "--json", "--state", "set-aside", "--home", home.path])
    assert got.returncode == 0, got.stderr
    return [(r["n"], r["set_aside"]) for r in map(json.loads, got.stdout.splitlines())]


@pytest.mark.parametrize("queue_backend", ["log"], indirect=True)
def test_a_message_too_large_to_record_is_set_aside_and_the_rest_is_delivered(qmail_home, daemons):
    qmail_home.control("maxrcpt", "0\n")
    qmail_home.control("envnoathost", ENVNOATHOST + "\n")
    done = qmail_home.queue_message(MSG, b"joe@test.example", [b"%x" % (i % 16) for i in range(RECIPIENTS)])
    assert done.returncode == 0, done.stderr
    [poison] = [m.n for m in queued(qmail_home)]
    reason = "%d recipients take more than a log record holds once rewritten" % RECIPIENTS
    # qmailctl queue list shows it set aside before qmail-send has met it: the same check
    assert listed_set_aside(qmail_home) == [(poison, reason)]
    daemons.start()
    lines = daemons.wait_line(r"^warning: msg %d: set aside: " % poison)
    assert ("warning: msg %d: set aside: %d recipients take more than a log record holds once "
            "rewritten" % (poison, RECIPIENTS)) in lines
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bob@test.example"]).returncode == 0
    lines = daemons.wait_line(r"^end msg ")
    assert daemons.proc.poll() is None
    assert "end msg %d" % poison not in lines
    # still listed, as queued and not yet preprocessed, with its recipients
    listed = qmail_home.run(["qmailctl", "queue", "list", "--json", "--home", qmail_home.path])
    assert listed.returncode == 0, listed.stderr
    records = {r["n"]: r for r in map(json.loads, listed.stdout.splitlines())}
    record = records.pop(poison)
    assert (record["state"], len(record["recipients"]), record["set_aside"]) == ("S4", RECIPIENTS, reason)
    assert [r["set_aside"] for r in records.values()] == [None] * len(records)
    assert listed_set_aside(qmail_home) == [(poison, reason)]
    text = qmail_home.run(["qmailctl", "queue", "list", "--home", qmail_home.path, str(poison)])
    assert text.stdout.split(b"\n", 1)[0].endswith(b">  set aside: " + reason.encode()), text.stdout[:200]
    # a restart meets it again, sets it aside again, and lives on
    assert daemons.stop() == 0
    daemons.start()
    daemons.wait_for(lambda l: sum(1 for x in l if re.match(r"warning: msg %d: set aside" % poison, x)) == 2,
                     30, "set aside again")
    assert daemons.proc.poll() is None
    got = delete(qmail_home, poison)
    assert (got.returncode, got.stdout) == (0, b"%d: deleted\n" % poison), got.stderr
    daemons.wait_line(r"^delete msg %d$" % poison)
    wait_mess_gone(qmail_home, poison)
    assert daemons.stop() == 0
    daemons.start()
    daemons.wait_started()
    assert daemons.stop() == 0
    assert sum(1 for x in daemons.lines() if "set aside" in x) == 2
    assert leftovers(qmail_home) == []


@pytest.mark.both_backends
def test_delete_while_qmail_send_is_down_removes_queued_and_preprocessed_messages(qmail_home, daemons):
    # a preprocessed message with a deferred recipient, left when qmail-send stops
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"defer@test.example"]).returncode == 0
    daemons.start()
    lines = daemons.wait_line(r"^delivery \d+: deferral: ")
    [waiting] = [int(m.group(1)) for m in map(re.compile(r"new msg (\d+)$").match, lines) if m]
    assert daemons.stop() == 0
    # and one queued while it was down, never preprocessed
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bob@test.example"]).returncode == 0
    [fresh] = [m.n for m in queued(qmail_home)]
    missing = max(waiting, fresh) + 1
    got = delete(qmail_home, waiting, fresh, missing)
    assert got.returncode == 1, got.stderr
    assert sorted(got.stdout.splitlines()) == sorted([b"%d: deleted" % waiting, b"%d: deleted" % fresh])
    assert got.stderr == b"qmailctl queue delete: %d: not in queue\n" % missing
    assert leftovers(qmail_home) == []
    # a restart finds nothing of them
    since = daemons.line_count()
    daemons.start()
    daemons.wait_started()
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"ann@test.example"]).returncode == 0
    daemons.wait_line(r"^end msg ")
    assert daemons.stop() == 0
    # only ann's message: the file system may give it a deleted message's inode number,
    # so the deleted ones are told apart by their recipients, not their numbers
    after = daemons.lines()[since:]
    assert len([l for l in after if l.startswith("new msg ")]) == 1, after
    assert [re.sub(r"^.* to ", "", l) for l in after if l.startswith("starting delivery ")] == [
        "local ann@test.example"], after
    assert leftovers(qmail_home) == []


@pytest.mark.both_backends
def test_a_delete_never_works_around_a_qmail_send_holding_its_mutex(qmail_home, daemons):
    """Whoever holds lock/sendmutex (here: this test, as a qmail-send would) owns the queue:
    qmailctl then hands the delete to it instead of acting itself, and a qmail-send that
    starts while qmailctl holds it refuses to start."""
    from qmailpy.ctl.queueoffline import lock_send
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bob@test.example"]).returncode == 0
    [n] = [m.n for m in queued(qmail_home)]
    mutex = lock_send(qmail_home.queue)
    try:
        got = qmail_home.run(["qmailctl", "queue", "delete", "--home", qmail_home.path, "--timeout", "1",
                              str(n)])
        assert (got.returncode, got.stdout) == (111, b"")
        assert b"did not take the command in 1 s; nothing done" in got.stderr
        assert [m.n for m in queued(qmail_home)] == [n]
        daemons.start()
        daemons.wait_line(r"^alert: cannot start: qmail-send is already running$")
        assert daemons.proc.wait(timeout=30) == 111
    finally:
        os.close(mutex)
    got = delete(qmail_home, n)
    assert (got.returncode, got.stdout) == (0, b"%d: deleted\n" % n), got.stderr
    assert leftovers(qmail_home) == []


@pytest.mark.dir_only       # writes a todo/ file qmail-send cannot read
def test_a_todo_entry_that_never_preprocesses_is_deleted_while_qmail_send_runs(qmail_home, daemons):
    """The directory backend keeps qmail's way with a todo/ entry it cannot read (a warning
    at every scan, tests/test_send_loop.py); delete removes it once TODO_TRIES scans failed."""
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bob@test.example"]).returncode == 0
    [n] = [m.n for m in queued(qmail_home)]
    with open(os.path.join(qmail_home.queue, "todo", str(n)), "ab") as f:
        f.write(b"Zjunk\0")
    daemons.start()
    daemons.wait_line(r"^warning: unknown record type in todo/%d$" % n)
    got = delete(qmail_home, n)
    assert (got.returncode, got.stdout) == (0, b"%d: deleted\n" % n), got.stderr
    daemons.wait_line(r"^delete msg %d$" % n)
    wait_mess_gone(qmail_home, n)
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"ann@test.example"]).returncode == 0
    daemons.wait_line(r"^end msg ")
    assert daemons.stop() == 0
    assert leftovers(qmail_home) == []


def test_a_replacement_too_large_for_a_record_is_a_queue_error_not_an_exit(tmp_path):
    """Bounce notes beyond what qmailpy/queuelimits.py lets a message reach (a queue from
    before the limits; qmail-send cuts each report): the REPLACEMENT that would hold them
    fails as a full disk does, a QueueError qmail-send warns about and retries, and the
    message keeps its last snapshot; an orderly exit still saves every other schedule."""
    from qmailpy.backends.log import records as R
    from qmailpy.backends.base import QueueError
    from qmailpy.backends.log.enqueue import enqueue
    from qmailpy.backends.log.queue import LogQueue
    from logqueue_harness import make_queue
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    big = enqueue(queue, MSG, b"joe@test.example", [b"%d@far.example" % i for i in range(3)])
    other = enqueue(queue, MSG, b"joe@test.example", [b"ann@far.example"])
    lq = LogQueue(home, runner_lags=(0,))
    lq.startup()
    for n in lq.new_work():
        lq.preprocess(n, lambda a: ("remote", a))
    records = lq.recipients(big, "remote")
    for record in records:
        lq.add_bounce_note(big, b"<x>:\n" + b"y" * (R.MAX_PAYLOAD // 3) + b"\n\n")
        lq.mark_done(big, "remote", record)
    with pytest.raises(QueueError, match="unable to record message %d: record payload too large" % big):
        lq.finish_channel(big, "remote")
    assert lq.channels_left(big) == ["remote"]
    lq.recipients(other, "remote")
    lq.save_schedule([(big, "remote", 1), (other, "remote", 2)])   # no exception for the big one
    lq.close()
    warnings = []
    again = LogQueue(home, runner_lags=(0,), log=warnings.append)
    again.startup()                      # recovery meets the same REPLACEMENT: a warning, no exit
    assert warnings == [b"warning: unable to record message %d: record payload too large\n" % big]
    assert sorted(m.n for m in again.list_messages()) == sorted([big, other])
    again.close()
