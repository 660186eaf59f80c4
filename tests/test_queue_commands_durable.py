"""qmailctl queue's actions survive what stops qmail-send (docs/qmail-send.md "Commands"):
they are on disk before qmail-send answers (the backend calls a command makes, then a
power cut that loses every unsynced write: docs/log-queue.md "Recovery and checkpoints"),
and a command claimed when qmail-send was killed is carried out at its next start."""
import json
import os
import re
import signal
import struct

import pytest

from logqueue_harness import make_queue, route
from qmailpy.backends.log.commit import list_segments, segment_name
from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.queue import LogQueue
from queue_commands_support import PEER, SlowDelivery, ctl, deferred_message, peer  # noqa: F401  (fixture)
from send_harness import Daemons, wait_gone, wait_mess_gone

pytestmark = pytest.mark.slow


def _power_cut(home):
    """Every append to the log after its last fsync is lost, and the boot changes."""
    logdir = os.path.join(home, "queue", "log")
    with open(os.path.join(logdir, "commit"), "r+b") as f:
        head, end, synced_seg, synced_end = struct.unpack("<QQQQ", f.read(32))
        f.seek(48)
        f.write(struct.pack("<Q", 0))           # not this boot: the next writer recovers
    for seg in list_segments(logdir):
        path = os.path.join(logdir, segment_name(seg))
        if seg > synced_seg:
            os.truncate(path, 0)
        elif seg == synced_seg:
            os.truncate(path, synced_end)


def _bring(lq, n):
    bring = getattr(lq, "bring", None)          # the backends' step after take(), where there is one
    assert bring is None or bring(n)


def _waiting_message(tmp_path):
    home = make_queue(tmp_path)
    n = enqueue(os.path.join(home, "queue"), b"Subject: hi\n\nhello\n", b"joe@a.example",
                [b"bob@b.example"])
    lq = LogQueue(home)
    lq.startup()
    assert lq.new_work() == [n]
    lq.preprocess(n, route)
    lq.reschedule(n, "remote", 2 ** 31)        # deferred: waiting for a retry
    lq.checkpoint(force=True)                   # everything so far is on disk
    return home, lq, n


def test_log_hold_is_synced_by_commit(tmp_path):
    home, lq, n = _waiting_message(tmp_path)
    assert lq.take([n]) == ([n], [])
    _bring(lq, n)
    lq.hold(n)
    lq.let_go(n)
    lq.commit()                                 # qmail-send answers "held" after this
    _power_cut(home)
    lq.close()
    lq = LogQueue(home)
    try:
        lq.startup()
        assert lq.take([n]) == ([n], [])
        _bring(lq, n)
        assert lq.is_held(n)
    finally:
        lq.close()


@pytest.mark.parametrize("queue_backend", ["log"], indirect=True)
def test_log_hold_and_delete_are_synced_before_the_answer(qmail_home, peer):  # noqa: F811
    """qmail-send answers a batch of actions only once they are on disk: killed just after
    the answers, with every unsynced append then lost, it comes back with the message
    still held and the other still deleted."""
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        held = deferred_message(qmail_home, daemons, peer, "bob")
        gone = deferred_message(qmail_home, daemons, peer, "amy")
        assert ctl(qmail_home, "hold", str(held)).stdout == b"%d: held\n" % held
        assert ctl(qmail_home, "delete", str(gone)).stdout == b"%d: deleted\n" % gone
        daemons.kill()
        _power_cut(qmail_home.path)
        since = daemons.line_count()
        daemons.start()
        daemons.wait_started()
        peer.rcpt_replies.clear()
        daemons.signal(signal.SIGALRM)           # anything waiting is due now
        assert qmail_home.queue_message(b"Subject: late\n\nhi\n", b"joe@test.example",
                                        [b"cat@" + PEER.encode()]).returncode == 0
        daemons.wait_for(lambda lines: any(l.startswith("end msg ") for l in lines[since:]),
                         what="the late message's end")
        assert [t.rcpt_tos for t in peer.transactions] == [["cat@" + PEER]]
        assert [l for l in daemons.lines()[since:]                  # (cat may get gone's number)
                if re.match(r"starting delivery \d+: msg (%d|%d) .* (bob|amy)@" % (held, gone), l)] == []
        listed = qmail_home.run(["qmailctl", "queue", "list", "--json", "--home", qmail_home.path])
        records = {r["n"]: r for r in map(json.loads, listed.stdout.splitlines())}
        assert gone not in records and records[held]["held"] is True
    finally:
        daemons.kill()


def test_a_queue_error_is_a_temporary_failure(qmail_home, peer):  # noqa: F811
    """(directory backend) hold cannot write hold/n (the directory is gone): qmail-send answers that it did
    not, for a reason that passes, and qmailctl exits 111 (not 1, 'not held'-like)."""
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        os.rmdir(os.path.join(qmail_home.queue, "hold"))
        done = ctl(qmail_home, "hold", str(n))
        assert (done.returncode, done.stdout) == (111, b"")
        assert done.stderr.startswith(b"qmailctl queue hold: %d: queue error: " % n), done.stderr
    finally:
        daemons.kill()


@pytest.mark.both_backends
def test_a_delete_left_by_a_crash_is_carried_out_at_the_next_start(qmail_home):
    """qmail-send is killed while a delete waits for a delivery in flight (the command is
    claimed, NAME.work): qmailctl says so and exits 111; the next qmail-send carries the
    command out before any pass, so neither recipient is delivered by it, and answers."""
    slow = SlowDelivery(qmail_home)
    cdir = os.path.join(qmail_home.queue, "command")
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = slow.queue(daemons)
        proc = slow.delete_claimed(n)
        claimed, = os.listdir(cdir)
        daemons.kill()                                  # the delivery never reported
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out) == (111, b"")
        assert err == (b"qmailctl queue delete: qmail-send stopped while carrying out the command; "
                       b"it finishes it when it starts again: %s\n" % os.path.join(cdir, claimed).encode())
        since = daemons.line_count()
        daemons.start()
        daemons.wait_line(r"^delete msg %d$" % n)
        wait_mess_gone(qmail_home, n)
        reply = os.path.join(cdir, claimed[:-len(".work")] + ".reply")
        wait_gone(os.path.join(cdir, claimed))          # answered: the reply is in place first
        with open(reply, "rb") as f:
            assert f.read() == b"%d done deleted\n" % n
        assert os.listdir(cdir) == [os.path.basename(reply)]   # left for a day, then removed
        assert [l for l in daemons.lines()[since:] if l.startswith("starting delivery ")] == []
        assert os.listdir(slow.other_new) == []
    finally:
        daemons.kill()
        slow.go(wait=False)                             # the orphaned delivery may end


def test_more_claimed_commands_than_a_scan_are_all_taken_up(qmail_home, peer):  # noqa: F811
    """(directory backend) 70 commands a crash left claimed (NAME.work), more than the 64
    files qmail-send reads in one turn, and a new one: each is carried out once and
    answered."""
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        assert daemons.stop() == 0
        cdir = os.path.join(qmail_home.queue, "command")
        names = ["%03d" % i for i in range(70)]
        for name in names:
            with open(os.path.join(cdir, name + ".work"), "wb") as f:
                f.write(b"action hold\nmsg %d\nmsg %d\n" % (n, 10 ** 12 + int(name)))
        with open(os.path.join(cdir, "999"), "wb") as f:
            f.write(b"action hold\nmsg %d\n" % n)
        daemons.start()
        for name in names + ["999"]:
            wait_gone(os.path.join(cdir, name + ".work"))
        answers = {}
        for name in names + ["999"]:
            with open(os.path.join(cdir, name + ".reply"), "rb") as f:
                answers[name] = f.read()
        # a command's answers come in the order qmail-send acted (split by split), not the
        # order of its lines
        lines = {name: set(a.splitlines()) for name, a in answers.items()}
        done = [name for name, a in lines.items() if b"%d done held" % n in a]
        assert len(done) == 1                              # one hold; the others found it held
        for name in names:
            held = b"%d done held" % n if name in done else b"%d none already held" % n
            assert lines[name] == {held, b"%d none not in queue" % (10 ** 12 + int(name))}
        assert daemons.lines().count("hold msg %d" % n) == 1
        assert sorted(os.listdir(cdir)) == sorted(name + ".reply" for name in names + ["999"])
    finally:
        daemons.kill()
