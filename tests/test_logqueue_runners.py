"""Queue runners offer each deferred message at its own due time, whatever was written before it."""
import os
import time

from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.queue import LogQueue

from logqueue_harness import make_queue, route


def _deferred(lq, n, when):
    lq.recipients(n, "remote")
    lq.reschedule(n, "remote", when)
    assert n not in lq.state.active              # handed back: the runners offer it again


def test_a_later_record_due_sooner_is_offered_at_its_own_time_and_after_a_restart(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    x = enqueue(queue, b"x\n", b"s@x.example", [b"x@r.example"])
    y = enqueue(queue, b"y\n", b"s@x.example", [b"y@r.example"])
    t = int(time.time()) + 10
    lq = LogQueue(home, runner_lags=(0,))     # one runner: it owns every deferred message
    lq.startup()
    for n in lq.new_work():
        lq.preprocess(n, route)
    lq.due(t - 10)
    _deferred(lq, x, t + 1000)                # X's REPLACEMENT first, due later
    _deferred(lq, y, t + 100)                 # Y's after it, due sooner
    assert lq.state.active == {}
    assert lq.due(t + 99) == []
    assert lq.next_wakeup() in (t + 100, lq.state.last_checkpoint + 5)
    assert [(e.n, e.channel, e.due) for e in lq.due(t + 100)] == [(y, "remote", t + 100)]
    assert lq.state.runners[0].wake == t + 1000
    lq.mark_done(y, "remote", lq.recipients(y, "remote")[0])
    lq.finish_channel(y, "remote")
    lq.complete(y)
    lq.checkpoint(force=True, now=t + 100)
    lq.close()

    # X was passed by the runner before it was due: a restart must not lose it
    lq = LogQueue(home, runner_lags=(0,))
    lq.recover()
    assert lq.due(t + 999) == []
    assert [(e.n, e.channel, e.due) for e in lq.due(t + 1000)] == [(x, "remote", t + 1000)]
    lq.close()
