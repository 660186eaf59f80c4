"""The log backend's per-state counters (backends/log/counts.py) against a full read of
every message, through deliveries, small segments deleted as garbage, a crash without a
checkpoint, and recoveries with and without queue/log/counts; and LogQueue.stream_states()
(qmailctl queue list) against the full read qmail-qread uses."""
import os
import time

from qmailpy.backends.log import counts as logcounts
from qmailpy.backends.log.commit import LogWriter, list_segments
from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.queue import LogQueue
from qmailpy.ctl.queuesize import exact_sizes, sizes

from logqueue_harness import deliver_all, make_queue, route

LIMIT = 1500        # bytes per segment: a few records, so segments rotate and are deleted


def counted_now(home):
    """What `qmailctl queue size` answers from the counters, and what a full read finds."""
    lq = LogQueue(home, segment_limit=LIMIT)
    try:
        counts = lq.current_counts()
    finally:
        lq.close()
    assert counts is not None, "no queue/log/counts"
    return counts.as_dict(), exact_sizes(home)


def streamed_numbers(home):
    lq = LogQueue(home, segment_limit=LIMIT)
    try:
        return sorted(rec.n for rec, _, _ in lq.stream_states())
    finally:
        lq.close()


def listed_numbers(home):
    lq = LogQueue(home, segment_limit=LIMIT)
    try:
        return sorted(n for n, m in lq.latest_states().items())
    finally:
        lq.close()


def work(lq, far):
    """qmail-send's moves on everything due: local recipients delivered, remote ones
    deferred to `far`, messages with no channel left completed."""
    for n in lq.new_work():
        lq.preprocess(n, route)
    for n in list(lq.state.active):
        for channel in lq.channels_left(n):
            records = lq.recipients(n, channel)
            if channel == "remote":
                lq.reschedule(n, channel, far)
                continue
            for record in records:
                lq.mark_done(n, channel, record)
            lq.finish_channel(n, channel)
        if lq.completion_due(n):
            lq.complete(n)


def test_counters_follow_the_log(tmp_path):
    home = make_queue(tmp_path)
    with open(os.path.join(home, "control", "queuebackend"), "w") as f:
        f.write("log\n")
    queue = os.path.join(home, "queue")
    logdir = os.path.join(queue, "log")
    writer = LogWriter(logdir, LIMIT)
    deferred = [b"d%d@far.example" % i for i in range(6)]

    def submit(i):
        rcpts = [b"u%d@test.example" % i] + ([deferred[i % 6]] if i % 2 else [])
        return enqueue(queue, b"m%d\n" % i, b"s@x", rcpts, writer=writer)

    lq = LogQueue(home, segment_limit=LIMIT)
    lq.startup()
    for i in range(20):
        submit(i)
    far = int(time.time()) + 10**6
    work(lq, far)
    lq.checkpoint(force=True)
    assert min(list_segments(logdir)) > 1          # garbage segments were deleted
    counted, exact = counted_now(home)
    assert exact == {"total": 10, "new": 0, "preprocessed": 10, "local": 0, "remote": 10, "held": 0}
    assert counted == exact
    assert streamed_numbers(home) == listed_numbers(home)

    # more work and no checkpoint: a crash; the reader adds the records after the counters
    for i in range(20, 26):
        submit(i)
    lq.new_work()
    fresh = sorted(lq.state.pending_new)
    lq.preprocess(fresh[0], route)
    lq.recipients(fresh[0], "local")                # a pass in flight when it dies
    for i in range(26, 29):
        submit(i)
    lq.close()
    counted, exact = counted_now(home)
    assert exact["new"] == 8 and exact["preprocessed"] == 11
    assert counted == exact
    assert streamed_numbers(home) == listed_numbers(home)

    # recovery from queue/log/counts, then without it (counted once from the whole log)
    for drop in (False, True):
        if drop:
            os.unlink(os.path.join(logdir, logcounts.COUNTS))
        lq = LogQueue(home, segment_limit=LIMIT)
        lq.startup()
        assert lq.state.state_counts.as_dict() == exact
        lq.close()
        counted, again = counted_now(home)
        assert counted == again == exact

    # and after the rest is delivered, nothing is left
    lq = LogQueue(home, segment_limit=LIMIT)
    lq.startup()
    deliver_all(lq, str(tmp_path / "deliveries"), now=far + 1)
    lq.checkpoint(force=True)
    lq.close()
    counted, exact = counted_now(home)
    assert counted == exact == dict.fromkeys(exact, 0)
    assert sizes(home) == exact and streamed_numbers(home) == []
