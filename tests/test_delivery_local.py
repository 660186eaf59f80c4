"""End to end through qmail-start with the real qmail-lspawn and qmail-local:
what a user sees in Maildirs, mboxes and qmail-send's log."""
import fcntl
import os
import re
import shutil
import subprocess

import pytest

from delivery_support import MSG, queue, new_msgs, wait_maildir
from send_harness import shared_dir, wait_mess_gone

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def test_local_to_local_maildir_log_sequence(qmail_home, users, daemons):
    bench = users.add("bench")
    daemons.start()
    lines = daemons.wait_line(r"^status: ")
    assert lines[0] == "status: local 0/10 remote 0/20"
    assert {"qmail-send", "qmail-lspawn", "qmail-rspawn", "qmail-clean"} <= set(daemons.daemons())
    queue(qmail_home, b"joe@test.example", [b"bench@test.example"])
    lines = daemons.wait_line(r"^end msg ")
    n = new_msgs(lines)[0]
    body = [l for l in lines[1:] if not l.startswith("status:")]
    assert re.fullmatch(r"info msg %d: bytes \d+ from <joe@test.example> qp \d+ uid \d+" % n, body[1])
    assert body[0] == "new msg %d" % n
    assert body[2:] == ["starting delivery 1: msg %d to local bench@test.example" % n,
                        "delivery 1: success: did_1+0+0/",
                        "end msg %d" % n]
    assert [l for l in lines if l.startswith("status:")] == [
        "status: local 0/10 remote 0/20", "status: local 1/10 remote 0/20",
        "status: local 0/10 remote 0/20"]
    (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert got.startswith(b"Return-Path: <joe@test.example>\nDelivered-To: bench@test.example\n"
                          b"Received: (qmail ")
    assert got.endswith(b"\n" + MSG)
    wait_mess_gone(qmail_home, n)


def test_nonexistent_user_bounces_to_sender(qmail_home, users, daemons):
    bench = users.add("bench")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"bench@test.example", [b"nosuchuser@test.example"])
    lines = daemons.wait_line(r"^end msg ", 2)
    assert "delivery 1: failure: Sorry,_no_mailbox_here_by_that_name._(#5.1.1)/" in lines
    (bounce,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert b"\nReturn-Path: <>\n" in bounce.split(b"\n\n", 1)[0] + b"\n" or bounce.startswith(b"Return-Path: <>\n")
    assert b"Subject: failure notice\n" in bounce
    assert b"<nosuchuser@test.example>:\nSorry, no mailbox here by that name. (#5.1.1)\n" in bounce
    assert b"--- Below this line is a copy of the message.\n\nReturn-Path: <bench@test.example>\n" in bounce


def test_postmaster_any_case_reaches_alias(qmail_home, users, daemons):
    bench = users.add("bench")
    alias = os.path.join(qmail_home.path, "alias")
    users.write(os.path.join(alias, ".qmail-postmaster"), "&bench@test.example\n")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@far.example", [b"PostMaster@test.example"])
    daemons.wait_line(r"^end msg ", 2)
    (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert b"Delivered-To: bench@test.example\n" in got
    assert b"Delivered-To: PostMaster@test.example\n" in got or b"Delivered-To: postmaster@test.example\n" in got


def test_double_bounce_reaches_doublebounceto(qmail_home, users, daemons):
    admin = users.add("admin")
    qmail_home.control("doublebounceto", "admin")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"", [b"nosuchuser@test.example"])
    lines = daemons.wait_line(r"^end msg ", 2)
    assert re.search(r"^info msg \d+: bytes \d+ from <#@\[\]> qp \d+ uid \d+$", "\n".join(lines), re.M)
    (got,) = wait_maildir(os.path.join(admin, "Maildir"), 1)
    assert got.startswith(b"Return-Path: <#@[]>\nDelivered-To: admin@test.example\n")
    assert b"I tried to deliver a bounce message to this address, but the bounce bounced!\n" in got


def test_program_delivery_and_forward(qmail_home, users, daemons):
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    out = os.path.join(bench, "prog-out")
    users.dotqmail(bench, "-prog", "|cat > %s; echo program delivered it\n" % out)
    users.dotqmail(bench, "-fwd", "&bench@test.example\n")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@far.example", [b"bench-prog@test.example"])
    lines = daemons.wait_line(r"^end msg ")
    assert "delivery 1: success: program_delivered_it/did_0+0+1/" in lines
    with open(out, "rb") as f:
        assert f.read().endswith(MSG)
    queue(qmail_home, b"joe@far.example", [b"bench-fwd@test.example"])
    lines = daemons.wait_line(r"^end msg ", 3)
    fwd = [l for l in lines if re.match(r"delivery 2: success: did_0\+1\+0/qp_\d+/$", l)]
    assert fwd, lines
    qp = fwd[0].rsplit("_", 1)[1].rstrip("/")
    assert re.search(r"^info msg \d+: bytes \d+ from <joe@far.example> qp %s uid \d+$" % qp,
                     "\n".join(lines), re.M)
    (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert b"Delivered-To: bench-fwd@test.example\n" in got


def test_mbox_with_two_writers_at_once(qmail_home, users, daemons):
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    users.dotqmail(bench, "-box", "./mbox\n")
    daemons.start()
    daemons.wait_line(r"^status: ")
    # one message, twenty recipients that all land in the same mbox: parallel qmail-locals
    rcpts = [b"bench-box@test.example"] * 20
    queue(qmail_home, b"joe@far.example", rcpts, b"Subject: box\n\nFrom here\n>From there\nend")
    lines = daemons.wait_line(r"^end msg ")
    assert max(int(re.search(r"local (\d+)/", l).group(1)) for l in lines if l.startswith("status:")) > 1
    assert sum(1 for l in lines if re.fullmatch(r"delivery \d+: success: did_1\+0\+0/", l)) == 20
    with open(os.path.join(bench, "mbox"), "rb") as f:
        mbox = f.read()
    entries = mbox.split(b"\n\nFrom ")
    assert len(entries) == 20
    for entry in entries:
        assert b"\nReturn-Path: <joe@far.example>\nDelivered-To: bench-box@test.example\n" in entry
        assert b"\n>From here\n>>From there\nend" in entry


def in_flight(lines):
    """The most deliveries ever started and not yet reported, from the log alone."""
    running = peak = 0
    for line in lines:
        if line.startswith("starting delivery "):
            running += 1
            peak = max(peak, running)
        elif re.match(r"delivery \d+: ", line):
            running -= 1
    return peak


def test_concurrencylocal_bounds_deliveries_in_flight(qmail_home, users, daemons):
    qmail_home.control("concurrencylocal", "2\n")
    gate = os.path.join(shared_dir(qmail_home, "work"), "gate")
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    # each delivery blocks until the test lets go of its exclusive lock on the gate
    users.dotqmail(bench, "-slow-default", "|flock -s %s true\n" % gate)
    with open(gate, "wb") as held:
        os.chmod(gate, 0o644)
        fcntl.flock(held, fcntl.LOCK_EX)
        daemons.start()
        assert daemons.wait_line(r"^status: ")[0] == "status: local 0/2 remote 0/20"
        queue(qmail_home, b"joe@far.example", [b"bench-slow-%d@test.example" % i for i in range(10)])
        lines = daemons.wait_line(r"^status: local 2/2 remote 0/20$")
        assert sum(1 for l in lines if l.startswith("starting delivery ")) == 2
        fcntl.flock(held, fcntl.LOCK_UN)
    lines = daemons.wait_line(r"^end msg ")
    assert sum(1 for l in lines if re.fullmatch(r"delivery \d+: success: did_0\+0\+1/", l)) == 10
    statuses = [re.match(r"status: local (\d+)/(\d+) remote 0/20$", l) for l in lines
                if l.startswith("status:")]
    assert all(statuses) and {m.group(2) for m in statuses} == {"2"}
    assert max(int(m.group(1)) for m in statuses) == 2
    assert in_flight(lines) == 2


ZERO_TIMEOUT = re.compile(r"^p?select6?\(.*\{tv_sec=0, tv_n?sec=0\}")


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
def test_a_full_channel_with_overdue_messages_is_waited_for_not_polled(qmail_home, users, daemons, tmp_path):
    """Every local slot busy and more local messages due: qmail-send sleeps in select()
    until a delivery reports, as qmail does; it must not wake again and again for the
    overdue messages it cannot start (a busy loop that ate a CPU under any backlog)."""
    qmail_home.control("concurrencylocal", "1\n")
    qmail_home.control("smtproutes", "closed.example:127.0.0.1:1\n")
    gate = os.path.join(shared_dir(qmail_home, "work"), "gate")
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    users.dotqmail(bench, "-slow-default", "|flock -s %s true\n" % gate)
    trace = tmp_path / "selects"
    with open(gate, "wb") as held:
        os.chmod(gate, 0o644)
        fcntl.flock(held, fcntl.LOCK_EX)
        daemons.start()
        daemons.wait_line(r"^status: ")
        for i in range(3):
            queue(qmail_home, b"joe@far.example", [b"bench-slow-%d@test.example" % i])
        daemons.wait_line(r"^info msg ", count=3)
        daemons.wait_line(r"^status: local 1/1 ")
        strace = subprocess.Popen(["strace", "-o", str(trace), "-e", "trace=select,pselect6",
                                   "-p", str(daemons.proc.pid)], stderr=subprocess.PIPE, text=True)
        try:
            attached = strace.stderr.readline()
            if "attached" not in attached:
                pytest.skip("strace cannot attach here: %s" % attached.strip())
            # a window of real work while the local channel stays full: one remote
            # delivery, to a closed port, from queueing to its deferral
            queue(qmail_home, b"joe@far.example", [b"someone@closed.example"])
            daemons.wait_line(r"^delivery \d+: deferral: ")
        finally:
            strace.terminate()
            strace.wait(timeout=30)
        fcntl.flock(held, fcntl.LOCK_UN)
    daemons.wait_line(r"^end msg ", count=3)
    calls = trace.read_text().splitlines()
    assert len(calls) >= 2, calls                 # it did wake for the remote delivery
    polls = [c for c in calls if ZERO_TIMEOUT.search(c)]
    print("selects %d, zero timeout %d" % (len(calls), len(polls)))
    assert len(polls) <= 3, (len(polls), len(calls), polls[:5])
