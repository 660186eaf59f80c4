"""LogQueue through the QueueBackend interface: the whole life of messages, runners,
segment rotation and deletion, recovery after a crash."""
import os
import subprocess
import sys
import time

import pytest

from qmailpy import states
from qmailpy.backends.base import QueueBackend
from qmailpy.backends.log.commit import LogWriter, list_segments
from qmailpy.backends.log.enqueue import append_envelope, enqueue
from qmailpy.backends.log.queue import LogQueue
from qmailpy.send.clean import CleanClient, CleanerLost

from logqueue_harness import deliver_all, deliveries, make_queue, route


def _records(home):
    lq = LogQueue(home)
    try:
        return [(r.name, r.n) for r in lq.scan()]
    finally:
        lq.close()


def test_every_interface_method_is_implemented():
    abstract = {name for name, value in vars(QueueBackend).items()
                if getattr(value, "__isabstractmethod__", False)}
    assert abstract and all(getattr(LogQueue, name) is not getattr(QueueBackend, name) for name in abstract)
    LogQueue("/nonexistent")            # instantiable: nothing abstract left


def test_life_of_a_message_through_the_interface(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    n = enqueue(queue, b"Subject: hi\n\nhello\n", b"joe@a.example",
                [b"fred@test.example", b"bob@b.example", b"amy@c.example"])
    mess = os.path.join(queue, "mess", str(n % 23), str(n))
    lq = LogQueue(home)
    assert lq.startup() == []
    assert lq.new_work() == [n]
    assert lq.counts() == (1, 1)
    assert lq.list_messages() == []                    # S4: not preprocessed yet
    p = lq.preprocess(n, route)
    assert (p.sender, p.size, p.channels) == (b"joe@a.example", os.path.getsize(mess), ("local", "remote"))
    assert lq.new_work() == [] and lq.counts() == (1, 0)
    assert lq.message_path(n) == "%d/%d" % (n % 23, n)
    assert lq.info(n) == (b"joe@a.example", p.birth)

    local = lq.recipients(n, "local")
    assert [(r.done, r.address) for r in local] == [(False, b"fred@test.example")]
    lq.mark_done(n, "local", local[0])
    lq.finish_channel(n, "local")
    assert lq.channels_left(n) == ["remote"] and not lq.completion_due(n)

    remote = lq.recipients(n, "remote")
    lq.mark_done(n, "remote", remote[0])
    lq.add_bounce_note(n, b"<amy@c.example>:\nno such user\n\n")
    lq.mark_done(n, "remote", remote[1])
    view, = lq.list_messages()
    assert view.state == states.S5 and view.bouncing and view.sender == b"joe@a.example"
    assert [(r.done, r.address) for r in view.remote] == [(True, b"bob@b.example"), (True, b"amy@c.example")]
    assert view.local == []
    lq.finish_channel(n, "remote")
    assert lq.completion_due(n)
    assert lq.bounce_notes(n) == b"<amy@c.example>:\nno such user\n\n"
    lq.drop_bounce_notes(n)
    assert lq.bounce_notes(n) is None
    lq.complete(n)
    assert os.path.exists(mess)                       # removed once FINISH is on disk
    lq.checkpoint(force=True)
    assert not os.path.exists(mess)
    assert lq.list_messages() == [] and lq.counts() == (0, 0)
    names = [name for name, _ in _records(home)]
    assert names == ["ENVELOPE", "PREPROCESSED", "START", "DELIVERY", "REPLACEMENT", "START",
                     "DELIVERY", "BOUNCE-NOTE", "DELIVERY", "REPLACEMENT", "REPLACEMENT", "FINISH"]
    # each record is a move of the shared S1-S5 table (ENVELOPE = S2 -> S3 -> S4 in one append)
    for name in set(names):
        assert states.path_exists(*states.RECORD_TRANSITIONS[name])
    lq.close()


def test_runners_offer_a_deferred_channel_when_due_and_not_before(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    n = enqueue(queue, b"x\n", b"s@x", [b"r@remote.example"])
    lq = LogQueue(home)
    lq.startup()
    lq.new_work()
    lq.preprocess(n, route)
    lq.recipients(n, "remote")
    t0 = int(time.time())
    lq.reschedule(n, "remote", t0 + 400)
    assert n not in lq.state.active                          # memory: nothing kept for it
    assert lq.due(t0) == []
    assert lq.due(t0 + 350) == []
    assert lq.next_wakeup() <= t0 + 400
    entry, = lq.due(t0 + 401)
    assert (entry.n, entry.channel, entry.due) == (n, "remote", t0 + 400)
    assert lq.due(t0 + 402) == []                      # offered once
    lq.close()


def test_segments_rotate_and_all_garbage_segments_are_deleted(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    lq = LogQueue(home, segment_limit=1500)
    lq.startup()
    logdir = os.path.join(queue, "log")
    writer = LogWriter(logdir, 1500)
    ns = [enqueue(queue, b"m%d\n" % i, b"s@x", [b"u%d@test.example" % i], writer=writer)
          for i in range(40)]
    assert len(list_segments(logdir)) >= 2
    deliver_all(lq, str(tmp_path / "deliveries"))
    assert max(list_segments(logdir)) > 5
    assert sorted(n for n, _ in deliveries(str(tmp_path / "deliveries"))) == sorted(ns)
    lq.checkpoint(force=True)
    after = list_segments(logdir)
    assert len(after) == 1 and after[0] == max(list_segments(logdir))
    assert all(not os.listdir(os.path.join(queue, "mess", str(s))) for s in range(23))
    lq.close()
    # a restart finds nothing to do
    lq = LogQueue(home, segment_limit=1500)
    assert lq.startup() == [] and lq.new_work() == [] and lq.list_messages() == []
    lq.close()


def test_live_segments_are_kept(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    lq = LogQueue(home, segment_limit=1500)
    lq.startup()
    keep = enqueue(queue, b"keep\n", b"s@x", [b"later@remote.example"])
    lq.new_work()
    lq.preprocess(keep, route)
    lq.recipients(keep, "remote")
    lq.reschedule(keep, "remote", int(time.time()) + 10**6)
    writer = LogWriter(os.path.join(queue, "log"), 1500)
    for i in range(30):
        enqueue(queue, b"m%d\n" % i, b"s@x", [b"u%d@test.example" % i], writer=writer)
    deliver_all(lq, str(tmp_path / "d"))
    lq.checkpoint(force=True)
    views = lq.list_messages()
    assert [v.n for v in views] == [keep]
    lq.close()


def test_recovery_reconciles_a_half_finished_pass(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    n = enqueue(queue, b"x\n", b"s@x", [b"a@r.example", b"b@r.example", b"c@r.example"])
    lq = LogQueue(home)
    lq.startup()
    lq.new_work()
    lq.preprocess(n, route)
    lq.checkpoint(force=True)
    recs = lq.recipients(n, "remote")
    lq.mark_done(n, "remote", recs[0])
    # crash: no REPLACEMENT, no FINISH; the lock and fds die with the process
    lq.close()
    warnings = []
    lq = LogQueue(home, log=warnings.append)
    entries = lq.startup()
    assert [(e.n, e.channel) for e in entries] == [(n, "remote")]
    recs = lq.recipients(n, "remote")
    assert [(r.done, r.address) for r in recs] == [(True, b"a@r.example"), (False, b"b@r.example"),
                                                   (False, b"c@r.example")]
    names = [name for name, _ in _records(home)]
    assert names[-3:] == ["DELIVERY", "REPLACEMENT", "START"]
    lq.close()


def test_run_all_now_offers_every_deferred_channel(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    ns = [enqueue(queue, b"x\n", b"s@x", [b"r%d@remote.example" % i]) for i in range(5)]
    lq = LogQueue(home)
    lq.startup()
    lq.new_work()
    later = int(time.time()) + 10**5
    for n in ns:
        lq.preprocess(n, route)
        lq.recipients(n, "remote")
        lq.reschedule(n, "remote", later)
    now = int(time.time())
    assert lq.due(now) == [] and lq.state.active == {}
    lq.run_all_now()
    entries = lq.due(now)
    assert sorted((e.n, e.channel, e.due) for e in entries) == sorted((n, "remote", now) for n in ns)
    assert lq.due(now) == []
    lq.close()


def test_lost_qmail_clean_leaves_bodies_for_recovery(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    n = enqueue(queue, b"x\n", b"s@x", [b"u@test.example"])
    mess = os.path.join(queue, "mess", str(n % 23), str(n))
    clean = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "qmail-clean")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, QMAILHOME=home))
    lq = LogQueue(home, cleaner=CleanClient(clean.stdin.fileno(), clean.stdout.fileno()))
    lq.startup()
    lq.new_work()
    lq.preprocess(n, route)
    rec, = lq.recipients(n, "local")
    lq.mark_done(n, "local", rec)
    lq.finish_channel(n, "local")
    lq.complete(n)
    clean.kill()
    clean.wait(timeout=30)
    with pytest.raises(CleanerLost):
        lq.checkpoint(force=True)
    assert os.path.exists(mess) and lq.state.to_clean == [n]
    clean.stdin.close()
    clean.stdout.close()
    lq.close()
    lq = LogQueue(home)                   # restart: the FINISH is replayed, the body goes
    lq.startup()
    assert not os.path.exists(mess)
    assert lq.list_messages() == []
    lq.close()


def test_a_number_reused_after_its_finish_keeps_the_new_body_through_recovery(tmp_path):
    """Message numbers are mess/ inodes: once b's body is unlinked, the next message may
    get b's number. A crash after that unlink but before the checkpoint that records it
    makes recovery replay b's FINISH; that must not remove the new message's body."""
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    n = enqueue(queue, b"b\n", b"s@x.example", [b"b@test.example"])
    lq = LogQueue(home)
    lq.startup()
    lq.checkpoint(force=True)
    deliver_all(lq, str(tmp_path / "deliveries"))
    assert lq.state.to_clean == [n]
    mess = os.path.join(queue, "mess", str(n % 23), str(n))
    os.unlink(mess)                                 # the clean, then the crash: no checkpoint
    lq.close()
    with open(mess, "wb") as f:                     # message c, numbered like b
        f.write(b"Received: (qmail 1 invoked by uid 0); 1 Jan 2026 00:00:00 -0000\n\nc\n")
    append_envelope(queue, n, os.getuid(), 1, b"s@x.example", [b"c@test.example"])
    lq = LogQueue(home)
    lq.startup()
    assert os.path.exists(mess) and lq.new_work() == [n]
    deliver_all(lq, str(tmp_path / "deliveries"))
    assert deliveries(str(tmp_path / "deliveries")) == [(n, b"b@test.example"), (n, b"c@test.example")]
    lq.checkpoint(force=True)
    assert not os.path.exists(mess)                 # c's own FINISH cleans it
    lq.close()
