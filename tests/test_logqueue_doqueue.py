"""SIGALRM (`qmailctl doqueue`) on the log backend: a sweep of the whole log that more
signals do not restart. Found by bench/kill_campaign.py: with a large log, a signal every
half second restarted the sweep from the oldest segment each time, so it never reached
the deferred messages and the queue stopped draining."""
import os
import signal
import time

import pytest

from delivery_support import queue, wait_maildir
from lspawn_harness import LocalUsers
from remote_harness import Smtpd
from send_harness import Daemons

pytestmark = pytest.mark.slow

N = 1500


def test_signals_faster_than_a_sweep_still_retry_every_message(qmail_home):
    home = qmail_home
    home.control("queuebackend", "log\n")
    users = LocalUsers(home)
    bench = users.add("bench")
    with Smtpd() as peer:
        home.control("smtproutes", "far.example:127.0.0.1:1\n")        # nothing listens: deferred
        daemons = Daemons(home).start()
        try:
            daemons.wait_started()
            # thousands of records of finished messages ahead of the tail, all garbage now
            for _ in range(N):
                queue(home, b"joe@test.example", [b"bench@test.example"])
            wait_maildir(os.path.join(bench, "Maildir"), N, timeout=120)
            daemons.wait_line(r"^end msg ", N, timeout=60)
            # then the deferred message, its live record behind all of them
            queue(home, b"joe@test.example", [b"r@far.example"])
            daemons.wait_line(r"^delivery \d+: deferral: ")
            home.control("smtproutes", "far.example:127.0.0.1:%d\n" % peer.port)
            # a signal every millisecond: each lands during the previous one's sweep
            deadline = time.monotonic() + 60
            while not peer.transactions:
                assert time.monotonic() < deadline, "the deferred message was never retried"
                daemons.signal(signal.SIGALRM)
                time.sleep(0.001)
            daemons.wait_line(r"^end msg ", N + 1)
            assert [t.rcpt_tos for t in peer.transactions] == [["r@far.example"]]
        finally:
            daemons.kill()
