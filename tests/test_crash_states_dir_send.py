"""Power cuts at every point of a protocol: qmail-send's whole run on the directory backend (preprocessing, local deliveries with
their marks, a bounce, qmail-clean's removals), with every "one unsynced kept" state.

What the explorer checks: tests/test_crash_states.py's docstring; the explorer is
tests/crash_explorer.py; the
protocols are split over several files so that two test processes share them.
"""
from crash_explorer import *  # noqa: F401,F403  (the explorer, its fixture and marks)


def test_dir_send_run(explorer_base):
    """Preprocessing, local deliveries and their marks, a bounce, qmail-clean's removals.

    Every "one unsynced kept" state too: a message queued later into the same mess/S/
    keeps qmail-clean's removal of an ended message's body while the earlier removals
    (info/, channel, bounce and todo/ files) are lost. The recorded run reached that
    state only when its bounce's inode fell into such a mess/S/, and it showed a defect:
    the message was retried for good without a body (backends/dir/scan.py _end_without_body)."""
    ex = Explorer(explorer_base, "dir")
    queue_for_send_run(ex)
    rec = ex.record_send_run()
    report("dir qmail-send run (3 messages, 4 deliveries, 1 bounce)",
           *ex.explore(rec, CAP, DIR_SEND_REGRESSIONS, single_keeps=True))
