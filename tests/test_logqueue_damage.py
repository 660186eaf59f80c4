"""Damaged segments must not strand intact messages (log backend).

Forty messages are deferred by real qmail-send and qmail-remote (nothing listens on
their route), qmail-send is stopped, bytes of the segment are damaged at seeded
random places, the route is fixed and qmail-send restarted. Every message that still
has a readable ENVELOPE or snapshot must then be delivered to every recipient, and
every message qmail-qread listed must be among them. Before the fix, a REPLACEMENT
lost in the damage left its predecessors flagged garbage: qmail-send never offered
the message again while qmail-qread listed it as pending.

QMAILPY_TEST_DAMAGE_SEEDS=1-20 widens the seeds (the figures in the commit message).
"""
import os
import random
import re
import signal

import pytest

import knobs
from qmailpy import logline
from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import list_segments, segment_name
from remote_harness import Smtpd
from send_harness import Daemons

pytestmark = pytest.mark.slow

MESSAGES = 40


def random_bytes(data, rng):
    for _ in range(16):
        i = rng.randrange(R.HEADER_SIZE, len(data))
        data[i] = rng.randrange(256)


def zeros_in_the_middle(data, rng):
    start = max(R.HEADER_SIZE, len(data) // 2 - 2048 + rng.randrange(-512, 512))
    data[start:start + 4096] = bytes(len(data[start:start + 4096]))


def torn_tail(data, rng):
    del data[len(data) - rng.randrange(1, 1500):]


DAMAGE = {"random16": random_bytes, "zeros4k": zeros_in_the_middle, "torn": torn_tail}


def readable_messages(data, seg):
    """Numbers of the messages with a checksum-valid ENVELOPE or snapshot in data."""
    records, _, _ = R.decode(bytes(data), seg, final=True)
    return {r.n for r in records if r.type == R.ENVELOPE or r.type in R.SNAPSHOTS}


def qread_numbers(home):
    got = home.run(["qmail-qread"])
    assert got.returncode == 0, got.stderr
    return {int(n) for n in re.findall(rb"  #(\d+)  ", got.stdout)}


@pytest.mark.parametrize("seed", knobs.damage_seeds())
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_segment_strands_no_intact_message(qmail_home, kind, seed):
    home = qmail_home
    home.control("queuebackend", "log\n")
    home.control("smtproutes", "far.example:127.0.0.1:1\n")          # nothing listens: deferred
    rcpts = {}
    with Smtpd() as peer:
        daemons = Daemons(home).start()
        try:
            daemons.wait_started()
            for i in range(MESSAGES):
                done = home.queue_message(b"Subject: %d\n\nmessage %d\n" % (i, i), b"joe@test.example",
                                          [b"m%d-a@far.example" % i, b"m%d-b@far.example" % i])
                assert done.returncode == 0, done.stderr
            daemons.wait_line(r"^delivery \d+: deferral: ", 2 * MESSAGES)
            assert daemons.stop() == 0
        finally:
            daemons.kill()
        for ev in daemons.events():
            if ev.kind == "starting delivery":
                rcpts.setdefault(ev.fields["n"], set()).add(ev.fields["recipient"])
        assert len(rcpts) == MESSAGES

        logdir = os.path.join(home.queue, "log")
        seg = list_segments(logdir)[-1]
        path = os.path.join(logdir, segment_name(seg))
        with open(path, "rb") as f:
            data = bytearray(f.read())
        DAMAGE[kind](data, random.Random(seed))
        with open(path, "wb") as f:
            f.write(data)
        intact = readable_messages(data, seg) & set(rcpts)
        listed = qread_numbers(home)
        assert listed <= intact

        home.control("smtproutes", "far.example:127.0.0.1:%d\n" % peer.port)
        daemons = Daemons(home).start()
        try:
            daemons.wait_started()
            daemons.signal(signal.SIGALRM)
            since = daemons.offset_of_start
            try:
                daemons.wait_for(lambda lines: intact <= {
                    e.fields["n"] for e in map(logline.parse, lines[since:]) if e.kind == "end msg"},
                    timeout=60, what="every intact message ended")
            except AssertionError:
                pass                                # the assertions below say which
            delivered = {r for t in peer.transactions for r in t.rcpt_tos}
            stranded = sorted(n for n in intact
                              if not rcpts[n] <= delivered)
            assert stranded == [], "%d of %d intact messages stranded (%d damaged away)\n%s" % (
                len(stranded), len(intact), MESSAGES - len(intact),
                "\n".join(l for l in daemons.lines()[since:] if l.startswith("warning")))
            assert qread_numbers(home) == set()
            restored = sum(1 for line in daemons.lines()[since:] if " state restored " in line)
            print("damage %s seed %d: %d intact, %d restored" % (kind, seed, len(intact), restored))
        finally:
            daemons.kill()
