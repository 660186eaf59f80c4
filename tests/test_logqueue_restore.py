"""Restoring messages stranded by a damaged segment (log/damage.py), in one process: the
restored record, its log line, quarantine/restored, qmail-qread's view and the 36-hour
cleanup around it. tests/test_logqueue_damage.py runs the real daemons."""
import os
import time

from qmailpy import logline
from qmailpy.backends.log import records as R
from qmailpy.backends.log.damage import RESTORED
from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.queue import LogQueue
from qmailpy.backends.log.segments import QUARANTINE
from qmailpy.layout import relpath

from logqueue_harness import make_queue, route

HOUR = 3600


def _deferred_queue(tmp_path, count=3):
    """count messages, each deferred an hour (its REPLACEMENT live), flags on disk."""
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    ns = [enqueue(queue, b"m%d\n" % i, b"s@x.example", [b"r%d@r.example" % i]) for i in range(count)]
    lq = LogQueue(home)
    lq.startup()
    for n in lq.new_work():
        lq.preprocess(n, route)
    for n in ns:
        lq.recipients(n, "remote")
        lq.reschedule(n, "remote", time.time() + HOUR)
    lq.checkpoint(force=True)
    lq.close()
    return home, ns


def _last_snapshots(home):
    seg = os.path.join(home, "queue", "log", "0000000001.seg")
    with open(seg, "rb") as f:
        records, _, _ = R.decode(f.read(), 1)
    return seg, {r.n: r for r in records if r.type == R.REPLACEMENT}


def test_a_lost_replacement_brings_its_message_back_once(tmp_path):
    home, ns = _deferred_queue(tmp_path)
    seg, latest = _last_snapshots(home)
    victim = latest[ns[1]]
    with open(seg, "r+b") as f:
        f.seek(victim.pos[1] + R.RECORD_HEADER_SIZE + 6)
        f.write(b"\xff\xff")
    lines = []
    lq = LogQueue(home, log=lines.append)
    lq.startup()
    qread = [v.n for v in lq.list_messages()]
    assert sorted(qread) == sorted(ns)                  # qmail-qread lists the stranded one
    lq.run_all_now()                                     # the sweep reads the damaged stretch
    now = int(time.time())
    offered = {e.n for e in lq.due(now)}
    assert ns[1] not in offered
    lq.checkpoint(force=True)
    restored = [logline.parse(line) for line in lines if b"state restored" in line]
    assert [(e.kind, e.fields["n"]) for e in restored] == [("state restored", ns[1])]
    prev = [r for r in R.decode(open(seg, "rb").read(), 1)[0]
            if r.n == ns[1] and r.type == R.PREPROCESSED][0]
    assert (restored[0].fields["seg"], restored[0].fields["off"]) == prev.pos
    assert (restored[0].fields["damage_seg"], restored[0].fields["damage_off"]) == victim.pos
    # the restored snapshot is due now and offered: qmail-send schedules what qmail-qread lists
    offered = {e.n: e for e in lq.due(now + 1)}
    assert ns[1] in offered and offered[ns[1]].channel == "remote"
    qdir = os.path.join(home, "queue", "log", QUARANTINE)
    with open(os.path.join(qdir, RESTORED)) as f:
        assert f.read() == "1.%d\n" % victim.pos[1]
    lq.close()
    # a restart does not restore it again
    lines.clear()
    lq = LogQueue(home, log=lines.append)
    lq.startup()
    assert not [line for line in lines if b"state restored" in line]
    lq.close()


def test_stale_cleanup_waits_for_the_restore_then_spares_only_older_bodies(tmp_path):
    home, ns = _deferred_queue(tmp_path)
    seg, latest = _last_snapshots(home)
    victim = latest[ns[0]]
    with open(seg, "r+b") as f:
        f.seek(victim.pos[1] + R.RECORD_HEADER_SIZE + 6)
        f.write(b"\xff\xff")
    queue = os.path.join(home, "queue")
    lq = LogQueue(home)
    lq.startup()
    lq.run_all_now()
    lq.due(lq.state.last_checkpoint)                            # quarantines the stretch; no checkpoint yet
    qdir = os.path.join(queue, "log", QUARANTINE)
    assert os.listdir(qdir) == ["1.%d" % victim.pos[1]]
    later = 2 ** 40
    # an orphan body from before the damage, one from after it
    old = os.path.join(queue, relpath("mess", 11))
    new = os.path.join(queue, relpath("mess", 12))
    for path in (old, new):
        with open(path, "wb") as f:
            f.write(b"orphan\n")
    damaged_at = os.stat(os.path.join(qdir, "1.%d" % victim.pos[1])).st_mtime
    os.utime(old, (damaged_at - 10, damaged_at - 10))
    os.utime(new, (damaged_at + 10, damaged_at + 10))
    assert list(lq.stale_messages(later)) == []           # not yet restored: nothing
    lq.checkpoint(force=True)                             # restores ns[0]
    assert list(lq.stale_messages(later)) == [12]
    lq.close()
