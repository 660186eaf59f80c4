"""SIGKILL qmail-send, qmail-lspawn, qmail-rspawn and qmail-clean in the middle of a
500-message run, restart each time, and prove that every recipient of every message
was delivered at least once and that nothing is left in the queue."""
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from inotify_simple import INotify, flags

from lspawn_harness import LocalUsers
from remote_harness import Smtpd
from queue_view import leftovers
from send_harness import Daemons, wait_gone

pytestmark = pytest.mark.slow

N = 500

INJECTOR = r'''
import sys
from qmailpy.queue.client import QueueClient
home, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    qq = QueueClient(home)
    qq.write(b"X-Crash-Id: %d\nSubject: crash test\n\nmessage %d\n" % (i, i))
    r = qq.finish(b"sender@test.example", [b"bench@test.example", b"r%d@far.example" % i])
    if not r.ok:
        sys.exit("qmail-queue failed for %d: %r" % (i, r))
'''


def queue_files(home):
    """What the queue still holds, on either backend (queue_view.leftovers)."""
    return leftovers(home)


def count_new(maildir):
    return len(os.listdir(os.path.join(maildir, "new")))


def wait_count(maildir, count, ino, timeout=120):
    deadline = time.monotonic() + timeout
    while count_new(maildir) < count:
        left = deadline - time.monotonic()
        assert left > 0, "only %d of %d deliveries" % (count_new(maildir), count)
        ino.read(timeout=int(min(left, 1.0) * 1000))


def crash_ids(maildir):
    ids = set()
    new = os.path.join(maildir, "new")
    for name in os.listdir(new):
        with open(os.path.join(new, name), "rb") as f:
            head = f.read(4096)
        ids.add(int(head.split(b"X-Crash-Id: ", 1)[1].split(b"\n", 1)[0]))
    return ids


def stuck_report(d, left):
    """The assertion message for a queue that does not empty: what is left and, for the
    first messages still live in the log, qmail-send's lines about them (run with
    QMAILPY_TEST_KEEP_HOMES=1 to keep the whole home and log)."""
    lines = d.lines()
    live = [p for p in left if not p.startswith(("mess/", "intd/"))]
    out = ["left in the queue: %s (and %d mess/ or intd/ files)" % (live[:10], len(left) - len(live))]
    for entry in [e for e in left if e.startswith("message ")][:5]:
        n = entry.split()[1]
        about = re.compile(r"\bmsg %s(:| |$)" % n)
        ids = {m.group(1) for m in (re.match(r"starting delivery (\d+): msg %s " % n, line)
                                   for line in lines) if m}
        said = [line for line in lines
                if about.search(line) or line.split(":")[0].split(" ")[-1] in ids]
        out.append("msg %s: %s" % (n, said[-12:]))
    return "\n".join(out)


def restart(d, home):
    """Wait for the remains of a killed run to exit, then start a new one."""
    procs = list(d.daemons().values())
    try:
        d.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait(timeout=10)
    psutil.wait_procs(procs, timeout=60)
    fresh = Daemons(home)
    fresh.start()
    fresh.wait_started()
    return fresh


@pytest.mark.both_backends
def test_sigkill_each_daemon_during_500_messages(qmail_home):
    users = LocalUsers(qmail_home)
    bench = users.add("bench")
    maildir = os.path.join(bench, "Maildir")
    with Smtpd() as smtpd:
        qmail_home.control("smtproutes", "far.example:127.0.0.1:%d\n" % smtpd.port)
        d = Daemons(qmail_home)
        d.start()
        d.wait_started()
        ino = INotify()
        ino.add_watch(os.path.join(maildir, "new"), flags.CREATE | flags.MOVED_TO)
        injector = subprocess.Popen([sys.executable, "-c", INJECTOR, qmail_home.path, str(N)],
                                    env=qmail_home.env)
        try:
            for threshold, victim in ((60, "qmail-lspawn"), (150, "qmail-send"), (240, "qmail-clean"),
                                      (330, "qmail-rspawn")):
                wait_count(maildir, threshold, ino)
                procs = d.daemons()
                assert victim in procs, procs
                procs[victim].send_signal(signal.SIGKILL)
                if victim != "qmail-send":
                    # losing a helper makes qmail-send exit by itself, with 111 for its
                    # supervisor (docs/qmail-send.md "Signals")
                    assert d.proc.wait(timeout=60) == 111
                    assert d.lines()[-1] == "status: exiting"
                d = restart(d, qmail_home)
            assert injector.wait(timeout=120) == 0
            # force every retry now; repeat while deliveries are still pending
            deadline = time.monotonic() + 120
            while (crash_ids(maildir) != set(range(N))
                   or {r for t in smtpd.transactions for r in t.rcpt_tos}
                   != {"r%d@far.example" % i for i in range(N)}):
                assert time.monotonic() < deadline, "deliveries missing after the crashes"
                d.signal(signal.SIGALRM)
                ino.read(timeout=1000)
            # Everything finished. What a crash may leave is S2/S3 debris: a mess (and intd)
            # file whose info was already gone when qmail-clean or qmail-send died. qmail
            # removes it 36 hours after its last access; age it and restart to see that.
            deadline = time.monotonic() + 60
            while True:
                left = queue_files(qmail_home)
                debris = [p for p in left if p.startswith(("mess/", "intd/"))]
                if left == debris:          # no info/, todo/, local/, remote/ or bounce/ left
                    break
                assert time.monotonic() < deadline, stuck_report(d, left)
                d.signal(signal.SIGALRM)
                ino.read(timeout=500)
            if debris:
                old = time.time() - 129600 - 600
                for p in debris:
                    try:
                        os.utime(os.path.join(qmail_home.queue, p), (old, old))
                    except FileNotFoundError:
                        # not debris: the log backend unlinks a finished message's body
                        # at its next checkpoint (every 5 s), which may come just now
                        pass
                assert d.stop() == 0
                d = Daemons(qmail_home)
                d.start()
                d.wait_started()
                for p in debris:
                    if p.startswith("mess/"):
                        wait_gone(os.path.join(qmail_home.queue, p), 60)
            assert queue_files(qmail_home) == []
            assert d.stop() == 0
        finally:
            if injector.poll() is None:
                injector.kill()
                injector.wait()
            d.kill()
    assert crash_ids(maildir) == set(range(N))
