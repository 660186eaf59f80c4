"""qmail's uid split on a live system with real, separate accounts (root only).

`qmailctl start --smtp` on a home made by `qmailctl init` as root (every role its own
account), a live SMTP session held open after MAIL FROM, and a qmail-remote held in
the middle of a delivery by a peer that never answers DATA. Then /proc/PID/status of
every process: each runs as the account qmail-qmqpd(8)'s ACCOUNTS table names, in
all four uid slots, and none that reads network input, DNS or a remote reply
(qmail-smtpd, qmail-rspawn, qmail-remote) holds the queue owner's uid or a group
that may write queue state, in any slot.
"""
import os
import socket
import stat
import subprocess
import time

import psutil
import pytest

from accounts import gid, temporary_multiuser_home, uid
from remote_harness import ScriptedPeer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create accounts"),
              pytest.mark.both_backends]

QUEUE_STATE = ("mess", "intd", "todo", "pid", "info", "local", "remote", "bounce", "lock", "log")
WAKE_UP_ONLY = ("trigger",)   # lock/trigger is 0622 as in qmail: writing it only wakes qmail-send


@pytest.fixture
def server_home(queue_backend):
    with temporary_multiuser_home(queue_backend) as home:
        try:
            yield home
        finally:
            subprocess.run(["qmailctl", "stop", "--home", home.path], env=home.env,
                           capture_output=True, timeout=120)


def ids(pid):
    """{'Uid': [real, effective, saved, fs], 'Gid': [...], 'Groups': [...]} of a process."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups"):
                out[key] = [int(v) for v in value.split()]
    return out


def queue_writing_groups(home):
    """Groups that may write some queue directory or a file in queue/log."""
    groups = set()
    for name in QUEUE_STATE:
        path = os.path.join(home.queue, name)
        paths = [path] + ([os.path.join(path, f) for f in os.listdir(path) if f not in WAKE_UP_ONLY]
                          if name in ("log", "lock") and os.path.isdir(path) else [])
        for p in paths:
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            if st.st_mode & stat.S_IWGRP:
                groups.add(st.st_gid)
    return groups


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def program(proc):
    argv = proc.cmdline()
    return next((os.path.basename(a) for a in argv[:3] if "qmail-" in a), proc.name())


def read_pid(home, name):
    with open(os.path.join(home.path, "log", name)) as f:
        return int(f.read().split()[0])


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def live(server_home):
    """The running system, a live session after MAIL FROM and a qmail-remote in mid-dialogue:
    {name: [pid, ...]} with the home."""
    home = server_home
    peer = ScriptedPeer([("send", b"220 slow.example\r\n"), ("line",), ("send", b"250 hi\r\n"),
                         ("line",), ("send", b"250 ok\r\n"), ("line",), ("send", b"250 ok\r\n"),
                         ("line",), ("hang",)])
    home.control("smtproutes", "far.example:127.0.0.1:%d\n" % peer.port)
    port = free_port()
    start = subprocess.run(["qmailctl", "start", "--home", home.path, "--smtp", "127.0.0.1:%d" % port],
                           env=home.env, capture_output=True, timeout=120)
    assert start.returncode == 0, start.stderr
    smtp = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        f = smtp.makefile("rb")
        assert f.readline().startswith(b"220 ")
        smtp.sendall(b"HELO client.example\r\n")
        assert f.readline().startswith(b"250 ")
        smtp.sendall(b"MAIL FROM:<a@client.example>\r\n")
        assert f.readline().startswith(b"250 ")
        sendmail = subprocess.run(["sendmail", "r@far.example"], input=b"Subject: x\n\nx\n",
                                  env=home.env, capture_output=True, timeout=60)
        assert sendmail.returncode == 0, sendmail.stderr
        send = psutil.Process(read_pid(home, "qmail-send.pid"))
        helpers = {program(p): p for p in send.children()}
        remote = wait_for(lambda: helpers["qmail-rspawn"].children(), "no qmail-remote running")
        listener = psutil.Process(read_pid(home, "qmail-smtpd.pid"))
        sessions = wait_for(lambda: listener.children(), "no qmail-smtpd session")
        qmqpd = psutil.Process(read_pid(home, "qmail-qmqpd.pid"))
        procs = {"qmail-send": [send.pid], "qmail-qmqpd": [qmqpd.pid],
                 "qmail-remote": [p.pid for p in remote], "qmail-smtpd": [p.pid for p in sessions]}
        procs.update({name: [p.pid] for name, p in helpers.items()})
        yield home, procs
        for pid in procs["qmail-remote"]:           # held by the peer: let qmailctl stop be quick
            os.kill(pid, 9)
    finally:
        smtp.close()
        peer.stopping = True


NETWORK = ("qmail-rspawn", "qmail-remote", "qmail-smtpd")


def test_every_process_runs_as_its_account_in_every_slot(live):
    home, procs = live
    expected = {"qmail-send": uid("qmails"), "qmail-clean": uid("qmailq"), "qmail-lspawn": 0,
                "qmail-rspawn": uid("qmailr"), "qmail-remote": uid("qmailr"),
                "qmail-qmqpd": uid("qmailq"), "qmail-smtpd": uid("qmaild")}
    assert set(expected) <= set(procs), procs
    for name, account in expected.items():
        for pid in procs[name]:
            assert ids(pid)["Uid"] == [account] * 4, (name, ids(pid))
    for pid in procs["qmail-smtpd"]:              # tcpserver -u qmaild -g nofiles
        got = ids(pid)
        assert got["Gid"] == [gid("nofiles")] * 4 and got["Groups"] == [gid("nofiles")], got
    for name in NETWORK:
        for pid in procs[name]:
            assert not {0, uid("qmailq")} & set(ids(pid)["Uid"]), (name, ids(pid))


def test_no_network_process_holds_a_group_that_may_write_queue_state(live):
    home, procs = live
    forbidden = queue_writing_groups(home)
    assert forbidden, "no group-writable queue state found: the check would check nothing"
    for name in NETWORK:
        for pid in procs[name]:
            got = ids(pid)
            assert not forbidden & set(got["Gid"] + got["Groups"]), (name, got, forbidden)
