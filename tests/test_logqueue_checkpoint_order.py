"""A finished message must not come back after a power cut (log backend, issue 29).

A checkpoint used to unlink the segments it made garbage (and finished messages'
bodies) before its new checkpoint file was renamed into place. On ext4 the next fsync
commits the journal, so the unlink could be durable while the old checkpoint was still
the one on disk: a message that checkpoint listed in flight, whose FINISH lived only in
the unlinked segment, was reloaded, given a REPLACEMENT due now, and deferred for ever
("qmail-spawn unable to open message"), its body long gone.

The disk state "power cut after the unlink, before the rename" is rebuilt with the real
qmail-send (tests/checkpoint_scenario.py: message M in flight across a checkpoint, whose
file and counts are kept; M finishes in the next segment, which a later checkpoint
deletes with M's body), then the kept checkpoint and counts are put back. qmail-send now
unlinks only after its checkpoint is in place (tests/test_crash_states.py explores that
order), and recovery ends a message in flight whose body is gone, with a warning naming
it, instead of retrying it (docs/log-queue.md "Recovery and checkpoints").
"""
import json
import os
import re
import subprocess
import sys

import checkpoint_scenario as scenario

import pytest
from lspawn_harness import LocalUsers
from qmailpy import logline
from send_harness import Daemons

pytestmark = pytest.mark.slow

SCENARIO = os.path.abspath(scenario.__file__)


def test_a_message_finished_in_an_unlinked_segment_is_not_revived(qmail_home):
    home = qmail_home
    home.control("queuebackend", "log\n")
    logdir = os.path.join(home.queue, "log")
    users = LocalUsers(home)
    users.add("a")
    work = os.path.dirname(home.path)
    go = scenario.setup(users, work)
    ran = subprocess.run([sys.executable, SCENARIO, home.path, work], env=home.env,
                         capture_output=True, timeout=300)
    assert ran.returncode == 0, ran.stderr.decode(errors="replace")
    scenario.release(go)
    with open(os.path.join(work, "scenario.json")) as f:
        facts = json.load(f)
    m, k = facts["m"], facts["k"]
    slow_new = os.path.join(users.base, "slow", "Maildir", "new")
    assert len(os.listdir(slow_new)) == 1
    for name in ("counts", "checkpoint"):          # as on disk before the unlink's checkpoint
        os.replace(os.path.join(work, "old-" + name), os.path.join(logdir, name))

    d = Daemons(home).start()
    try:
        d.wait_started()
        mess = "mess/%d/%d" % (m % 23, m)
        d.wait_line("^%s$" % re.escape(logline.ended_without_body(m, mess).decode().strip()))
        assert home.queue_message(b"Subject: after\n\nafter\n", b"joe@test.example",
                                  [b"a@test.example"]).returncode == 0
        d.wait_line(r"^end msg ")
        lines = d.lines()
        # (the new message may take M's number: numbers are inodes)
        assert not [x for x in lines if re.match(r"starting delivery \d+: msg %d to local slow@" % m, x)], lines
        assert not [x for x in lines if "unable to open" in x], lines
        assert len(os.listdir(slow_new)) == 1
        qread = home.run(["qmail-qread"])
        assert qread.returncode == 0
        listed = [int(x) for x in re.findall(rb"#(\d+)", qread.stdout)]
        assert m not in listed and k in listed, qread.stdout
    finally:
        d.kill()
