"""The log backend under load: concurrent injecting processes while a reader works the
growing head, and SIGKILLs of the worker at random moments of a larger run."""
import os
import random
import select
import signal
import subprocess
import sys

import pytest

from inotify_simple import INotify, flags

from qmailpy.backends.log.queue import LogQueue

from logqueue_harness import deliver_all, deliveries, make_queue

pytestmark = pytest.mark.slow

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]))

INJECTOR = r"""
import sys
from qmailpy.backends.log.enqueue import enqueue
queue, ident, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(count):
    enqueue(queue, b"Subject: %d.%d\n\n" % (ident, i) + b"x" * (i * 37 % 3000),
            b"s@x.example", [b"u%d.%d@test.example" % (ident, i), b"r%d.%d@far.example" % (ident, i)])
"""

WORKER = r"""
import sys
from qmailpy.backends.log.queue import LogQueue
from logqueue_harness import deliver_all
lq = LogQueue(sys.argv[1], runner_lags=(0,))
lq.startup()
print("up", flush=True)
deliver_all(lq, sys.argv[2], limit=100000)
lq.checkpoint(force=True)
print("done", flush=True)
"""


def test_reader_keeps_up_with_concurrent_injectors(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    os.mkfifo(os.path.join(queue, "lock", "trigger"), 0o622)
    trigger = os.open(os.path.join(queue, "lock", "trigger"), os.O_RDONLY | os.O_NONBLOCK)
    lq = LogQueue(home, runner_lags=(0,), segment_limit=64 * 1024)
    lq.startup()
    procs, count = 4, 40
    children = [subprocess.Popen([sys.executable, "-c", INJECTOR, queue, str(i), str(count)], env=ENV)
                for i in range(procs)]
    dpath = str(tmp_path / "deliveries")
    try:
        while len(deliveries(dpath)) < procs * count * 2:
            deliver_all(lq, dpath)
            if all(c.poll() is not None for c in children):
                deliver_all(lq, dpath)
                break
            readable, _, _ = select.select([trigger], [], [], 10)
            if readable:
                os.close(trigger)
                trigger = os.open(os.path.join(queue, "lock", "trigger"), os.O_RDONLY | os.O_NONBLOCK)
    finally:
        for c in children:
            c.wait(timeout=120)
        os.close(trigger)
    assert all(c.returncode == 0 for c in children)
    got = sorted(r for _, r in deliveries(dpath))
    want = sorted(b"%s%d.%d@%s" % (p, i, j, d) for i in range(procs) for j in range(count)
                  for p, d in ((b"u", b"test.example"), (b"r", b"far.example")))
    assert got == want
    assert lq.state.problems == []
    lq.checkpoint(force=True)
    assert lq.counts() == (0, 0)
    lq.close()


def test_sigkill_at_random_moments_under_load(tmp_path):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    subprocess.run([sys.executable, "-c", INJECTOR, queue, "0", "300"], env=ENV, check=True)
    dpath = str(tmp_path / "deliveries")
    rng = random.Random(5)
    kills = 0
    for _ in range(4):
        worker = subprocess.Popen([sys.executable, "-c", WORKER, home, dpath], env=ENV,
                                  stdout=subprocess.PIPE)
        assert worker.stdout.readline() == b"up\n"
        target = len(deliveries(dpath)) + rng.randrange(20, 120)
        # kill once the worker has made `target` deliveries (inotify on the file it appends to)
        with INotify() as ino:
            ino.add_watch(str(tmp_path), flags.MODIFY | flags.CREATE)
            while len(deliveries(dpath)) < target and worker.poll() is None:
                assert ino.read(timeout=30000) or worker.poll() is not None
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            kills += 1
        worker.wait(timeout=60)
    lq = LogQueue(home, runner_lags=(0,))
    lq.startup()
    deliver_all(lq, dpath, limit=100000)
    lq.checkpoint(force=True)
    got = [r for _, r in deliveries(dpath)]
    assert set(got) == {b"%s0.%d@%s" % (p, j, d) for j in range(300)
                        for p, d in ((b"u", b"test.example"), (b"r", b"far.example"))}
    assert kills >= 2
    assert len(got) - len(set(got)) <= kills           # at most the one in flight per kill
    assert lq.list_messages() == [] and lq.counts() == (0, 0)
    lq.close()
