"""A SIGALRM sweep (`qmailctl doqueue`) of the log backend that pauses part way through
the log must not bring back a message that was finished while it paused.

Found by bench/kill_campaign.py --via qmqpd (and behind the intermittent
tests/test_crash_delivery.py [log] failure: every message delivered, some still live in
the log while qmail-send got SIGALRM every 0.5 s): the sweep keeps its cursor, with a
buffer of the segment read before, across calls of due(). A runner offered a message
from that stretch, qmail-send delivered it, its snapshot was superseded and flagged
garbage at the next checkpoint (which forgets the superseded positions it flagged). The
sweep then went on in its old buffer, where the flag still read live, and offered the
superseded snapshot again: a new pass on a finished message whose body was gone
("qmail-spawn unable to open message", every retry, for ever).
"""
import os
import time

import pytest

from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.runners import FLUSH_IN_FLIGHT

from logqueue_harness import make_queue, started

pytestmark = pytest.mark.slow


def test_a_paused_sweep_does_not_offer_a_message_finished_meanwhile(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    # FLUSH_IN_FLIGHT messages that fill the sweep, then B right behind them
    many = [enqueue(queue, b"a %d\n" % i, b"s@x.example", [b"a%d@r.example" % i])
            for i in range(FLUSH_IN_FLIGHT)]
    b = enqueue(queue, b"b\n", b"s@x.example", [b"b@r.example"])
    t = int(time.time())
    lq = started(home)
    for n in many:                            # deferred until much later
        lq.recipients(n, "remote")
        lq.reschedule(n, "remote", t + 10000)
    lq.recipients(b, "remote")
    lq.reschedule(b, "remote", t + 1000)       # B, due sooner, written after them
    assert lq.state.active == {}
    # records are stamped with the real time they are written: on a loaded machine that
    # may be well after t, and a runner reads a record only once its time has come
    now = int(time.time()) + 1
    assert now < t + 1000
    lq.due(now)                               # the runner passes them all, none due yet

    lq.run_all_now()                          # SIGALRM: the sweep offers the first
    offered = []                              # FLUSH_IN_FLIGHT messages, then waits
    for _ in range(10):
        offered += [e.n for e in lq.due(now)]
    assert sorted(offered) == sorted(many)
    assert lq.state.flusher is not None             # paused just before B

    # meanwhile the runner offers B at its time and B is delivered and finished
    assert [e.n for e in lq.due(t + 1000)] == [b]
    lq.mark_done(b, "remote", lq.recipients(b, "remote")[0])
    assert lq.finish_channel(b, "remote") == []
    lq.complete(b)
    lq.checkpoint(force=True, now=t + 1000)    # flags written, B's body removed
    assert not os.path.exists(os.path.join(queue, "mess", str(b % 23), str(b)))

    for n in many:                            # the sweep's messages are handed back
        lq.reschedule(n, "remote", t + 10000)
    again = []
    for _ in range(10):
        again += [e.n for e in lq.due(t + 1000)]
        if lq.state.flusher is None:
            break
    assert lq.state.flusher is None                 # the sweep ended
    assert b not in again, "the sweep offered finished message %d again" % b
    assert b not in lq.state.active
    lq.close()
