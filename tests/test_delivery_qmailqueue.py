"""QMAILQUEUE in the daemons' environment: qmail-send's bounces and qmail-local's
forwards are handed to that program (message on fd 0, envelope on fd 1), as qmail's
qmail_open() does, and nothing of theirs enters the queue directly."""
import os

import pytest

from inotify_simple import INotify, flags

from delivery_support import queue
from lspawn_harness import LocalUsers
from send_harness import Daemons

pytestmark = pytest.mark.slow

FAKE_QQ = """#!/bin/sh
# a qmail-queue stand-in: keep the message and the envelope, say "queued"
out=%(out)s/$$
cat > "$out.mess"
cat <&1 > "$out.env"
touch "$out.done"
exit 0
"""


def wait_handed(out, count, timeout=30):
    """Wait (inotify) until the fake qmail-queue has finished `count` times."""
    import time
    with INotify() as ino:
        ino.add_watch(out, flags.CREATE | flags.MOVED_TO)
        deadline = time.monotonic() + timeout
        while True:
            done = sorted(n[:-5] for n in os.listdir(out) if n.endswith(".done"))
            if len(done) >= count:
                return done
            left = deadline - time.monotonic()
            assert left > 0, "the fake qmail-queue ran %d of %d times" % (len(done), count)
            ino.read(timeout=int(min(left, 1.0) * 1000))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_bounce_and_forward_go_through_qmailqueue(qmail_home):
    users = LocalUsers(qmail_home)
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    users.dotqmail(bench, "-fwd", "&elsewhere@far.example\n")
    work = os.path.join(os.path.dirname(qmail_home.path), "fakeqq")
    out = users.mkdir(work, 0o755)
    out = users.mkdir(os.path.join(work, "out"), 0o777)
    script = users.write(os.path.join(work, "qq"), FAKE_QQ % {"out": out}, 0o755)
    daemons = Daemons(qmail_home, env=dict(qmail_home.env, QMAILQUEUE=script))
    try:
        daemons.start()
        daemons.wait_line(r"^status: ")
        queue(qmail_home, b"bench@test.example", [b"nosuchuser@test.example"])
        queue(qmail_home, b"joe@far.example", [b"bench-fwd@test.example"])
        daemons.wait_line(r"^end msg ", 2)
        handed = wait_handed(out, 2)
    finally:
        daemons.kill()
    lines = daemons.lines()
    assert "delivery 1: failure: Sorry,_no_mailbox_here_by_that_name._(#5.1.1)/" in lines
    envelopes = sorted(read(os.path.join(out, pid + ".env")) for pid in handed)
    assert envelopes == [b"F\0Tbench@test.example\0\0",
                         b"Fjoe@far.example\0Telsewhere@far.example\0\0"]
    messages = {read(os.path.join(out, pid + ".env")): read(os.path.join(out, pid + ".mess")) for pid in handed}
    assert b"Subject: failure notice\n" in messages[envelopes[0]]
    assert messages[envelopes[1]].startswith(b"Delivered-To: bench-fwd@test.example\n")
    # qmail-send logged the forward's success with the stand-in's pid as qp
    forward_pid = [pid for pid in handed if read(os.path.join(out, pid + ".env")) == envelopes[1]][0]
    assert any(l.endswith("success: did_0+1+0/qp_%s/" % forward_pid) for l in lines), lines
    # nothing the daemons made entered the queue directly: no new msg beyond the two queued here
    assert len([l for l in lines if l.startswith("new msg ")]) == 2
