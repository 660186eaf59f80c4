"""A snapshot lost under the records that name it (log/recovery.py): a message's
PREPROCESSED torn by a power cut (an earlier unsynced append) while its START records,
the REPLACEMENT that ends its local channel and the DELIVERY of its remote recipient
after that were kept. Found by the crash-state explorer's full run (2 of 982 states of
tests/test_crash_states_send.py::test_remote_deliveries): recovery ignored the STARTs,
kept the checkpoint's ENVELOPE as not yet preprocessed, so qmail-send preprocessed the
message again beside its live REPLACEMENT; remote was delivered twice at once and
qmail-send stopped on `internal error in qmail-send: KeyError: 'remote'`. In one
process, through the LogQueue qmail-send drives; the bytes are the backend's own."""
import os
import time

from qmailpy.backends.log import records as R
from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.queue import LogQueue

from logqueue_harness import make_queue, route

LOCAL, REMOTE = b"fred@test.example", b"r@far.example"


def _segment(home):
    return os.path.join(home, "queue", "log", "0000000001.seg")


def _records(home):
    with open(_segment(home), "rb") as f:
        return R.decode(f.read(), 1)[0]


def _crashed_after_the_remote_delivery(tmp_path):
    """The message queued and checkpointed as new (the checkpoint lists its ENVELOPE),
    then preprocessed, both channels started, local delivered and ended (REPLACEMENT),
    remote delivered (DELIVERY); qmail-send dies there, with no checkpoint since."""
    home = make_queue(tmp_path)
    n = enqueue(os.path.join(home, "queue"), b"Subject: m\n\nm\n", b"joe@a.example", [LOCAL, REMOTE])
    lq = LogQueue(home, runner_lags=(0,))
    lq.startup()                                 # its checkpoint: n not yet preprocessed
    assert lq.new_work() == [n]
    lq.preprocess(n, route)
    local, = lq.recipients(n, "local")
    remote, = lq.recipients(n, "remote")
    lq.mark_done(n, "local", local)
    assert lq.finish_channel(n, "local") == ["remote"]
    lq.mark_done(n, "remote", remote)
    lq.sync_results()
    lq.close()
    return home, n


def test_a_torn_snapshot_under_its_starts_and_replacement(tmp_path):
    home, n = _crashed_after_the_remote_delivery(tmp_path)
    kinds = [(r.name, r.n) for r in _records(home)]
    assert kinds == [("ENVELOPE", n), ("PREPROCESSED", n), ("START", n), ("START", n),
                     ("DELIVERY", n), ("REPLACEMENT", n), ("DELIVERY", n)]
    snapshot = _records(home)[1]
    with open(_segment(home), "r+b") as f:          # torn: its second half never written
        f.seek(snapshot.pos[1] + snapshot.length // 2)
        f.write(bytes(snapshot.length - snapshot.length // 2))
    lines = []
    lq = LogQueue(home, log=lines.append, runner_lags=(0,))
    offered = lq.startup()
    warnings = b"".join(lines)
    assert b"names a lost snapshot" in warnings
    # not preprocessed again: its REPLACEMENT is its state, with the DELIVERY after it
    assert lq.new_work() == []
    offered += lq.due(int(time.time()) + 1)
    assert [(e.n, e.channel) for e in offered] == [(n, "remote")]
    assert [(r.done, r.address) for r in lq.recipients(n, "remote")] == [(True, REMOTE)]
    assert lq.channels_left(n) == ["remote"]
    assert lq.finish_channel(n, "remote") == []
    assert lq.completion_due(n)
    lq.close()
