"""Power cuts at every point of a protocol: qmail-queue (both backends; on the log backend group commit and rotation),
qmail-qmqpd's queueing path and `qmailctl convert` both ways.

What the explorer checks: tests/test_crash_states.py's docstring; the explorer is
tests/crash_explorer.py; the
protocols are split over several files so that two test processes share them.
"""
from crash_explorer import *  # noqa: F401,F403  (the explorer, its fixture and marks)


def test_log_group_commit_then_a_fourth_message(explorer_base):
    """The issue's reproduction: three concurrent qmail-queues, then a fourth."""
    ex = Explorer(explorer_base, "log")
    rec = ex.record_queue_runs(GROUP_COMMIT)
    report("log qmail-queue x3 (group commit) + 1", *ex.explore(rec, None))


def test_log_queue_runs_across_a_rotation(explorer_base):
    """qmail-queue runs that rotate the log to a new segment."""
    ex = Explorer(explorer_base, "log")
    ex.fill_segment()
    rec = ex.record_queue_runs([[("m1", RCPTS), ("m2", RCPTS)], [("m3", RCPTS)]])
    assert any(op.kind == "create" and op.path.startswith("queue/log/") and "commit" not in op.path
               for op in rec.ops), "no rotation recorded"
    report("log qmail-queue x2 + 1 across a rotation", *ex.explore(rec, CAP))


def test_dir_queue_runs(explorer_base):
    ex = Explorer(explorer_base, "dir")
    rec = ex.record_queue_runs([[("m1", RCPTS), ("m2", RCPTS)], [("m3", RCPTS)]])
    report("dir qmail-queue x2 + 1", *ex.explore(rec, CAP))


@pytest.mark.parametrize("backend", ["dir", "log"])
def test_qmqpd_requests(explorer_base, backend):
    """qmail-qmqpd's queueing path: concurrent requests on the local socket, then one more;
    a message is acknowledged where its client read the K answer. Every state after a K
    must hold that message for delivery."""
    ex = Explorer(explorer_base, backend)
    rec = ex.record_queue_runs([[("m1", RCPTS), ("m2", RCPTS)], [("m3", RCPTS)]], QMQP_DRIVER)
    report("%s qmail-qmqpd: 2 requests at once + 1" % backend, *ex.explore(rec, CAP))


@pytest.mark.parametrize("source,target", [("dir", "log"), ("log", "dir")])
def test_convert(explorer_base, source, target):
    ex = Explorer(explorer_base, source)
    ex.queue("m1", RCPTS)
    ex.queue("m2", [RCPTS[1]])
    rec = ex.record_convert(target)
    report("qmailctl convert --to %s (2 messages)" % target, *ex.explore(rec, CAP))
