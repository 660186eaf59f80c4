"""Power cuts at every point of a protocol: qmail-send's whole run on the log backend (recovery, checkpoints, the deletion of a
garbage segment; a hole among appends) and qmail-remote's deliveries on both backends.

What the explorer checks: tests/test_crash_states.py's docstring; the explorer is
tests/crash_explorer.py; the
protocols are split over several files so that two test processes share them.
"""
from crash_explorer import *  # noqa: F401,F403  (the explorer, its fixture and marks)


def test_log_send_run(explorer_base):
    """After a boot: recovery, deliveries, a bounce, checkpoints, a garbage segment deleted."""
    ex = Explorer(explorer_base, "log")
    ex.fill_segment()
    queue_for_send_run(ex)
    from_previous_boot(ex.home.queue)
    rec = ex.record_send_run()
    assert any(op.kind == "unlink" and op.path.startswith("queue/log/") for op in rec.ops), \
        "no segment deletion recorded"
    report("log qmail-send run (recovery, 3 messages, 1 bounce, segment deletion)",
           *ex.explore(rec, CAP, single_keeps=True))


def test_log_send_run_with_a_hole_among_appends(explorer_base):
    """Damage, not a crash on ext4: a record lost (zeros) with later records of the same
    message intact. A lost REPLACEMENT left the snapshot before it live after its FINISH
    had removed the body: the message was offered for good and never delivered (12 of
    the 168 states with any one append lost). Recovery now supersedes it too
    (log/recovery.py)."""
    ex = Explorer(explorer_base, "log")
    ex.fill_segment()
    queue_for_send_run(ex)
    from_previous_boot(ex.home.queue)
    rec = ex.record_send_run()
    report("log qmail-send run, one record lost behind later ones (POSIX appends)",
           *ex.explore(rec, None, posix_appends=True, only=a_hole_among_appends))


@pytest.mark.parametrize("backend", ["dir", "log"])
def test_remote_deliveries(explorer_base, backend):
    """qmail-remote's deliveries to a remote host that stores each message durably before
    its 250 (tests/maildir_peer.py), recorded with it: a crash after the peer stored a
    message and before qmail-send's record of the delivery ("Possible duplicate!"'s
    window) must send it again, never drop it; every state of that window is explored.
    Prints how many states left a recipient with two copies."""
    ex = Explorer(explorer_base, backend)
    ex.add_peer()
    ex.queue("m1", [RCPTS[0], REMOTE])
    ex.queue("m2", [REMOTE])
    rec = ex.record_send_run()
    stored = [op for op in rec.ops if op.kind == "link" and op.path.startswith("homes/farpeer/")]
    assert len(stored) == 2, "the peer stored %d messages" % len(stored)
    explored, distinct, failures = ex.explore(rec, CAP, always=peer_window(rec))
    print("remote deliveries (%s): states with a message delivered twice, by recipient: %s"
          % (backend, ex.duplicates))
    report("%s qmail-send run, 2 remote deliveries to a peer, 1 local" % backend, explored, distinct, failures)
    assert ex.duplicates.get(REMOTE), "no state had the peer's copy without qmail-send's record of it"
