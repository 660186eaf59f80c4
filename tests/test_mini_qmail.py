"""A mini-qmail host (`qmailctl init --mini HUB`) and a hub on 127.0.0.1: a cron-style
sendmail on the null client reaches the hub's user; with every hub down the caller
gets qmail's temporary failure and the hub's queue gets nothing."""
import os
import subprocess
import sys

import pytest

from qmqpd_harness import QmqpServer
from queue_view import leftovers
from test_delivery_local import wait_maildir
from test_qmqpc import dead_port

CRON_MAIL = b"To: bench@test.example\nSubject: cron output\n\nbackup done\n"


def make_mini(tmp_path, *hubs):
    mini = str(tmp_path / "mini")
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "qmailctl"), "init", "--home",
                           mini, "--me", "mini.example", "--mini", *hubs],
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"mini-qmail home (no queue)" in done.stdout
    assert not os.path.exists(os.path.join(mini, "queue"))
    with open(os.path.join(mini, "control", "qmqpservers")) as f:
        assert f.read() == "".join(h + "\n" for h in hubs)
    return mini


def cron_sendmail(mini, message=CRON_MAIL):
    # cron's environment: next to nothing
    env = {"PATH": "/usr/bin:/bin", "QMAILHOME": mini, "LOGNAME": "root", "HOME": "/"}
    return subprocess.run([os.path.join(mini, "bin", "sendmail"), "-t"], input=message,
                          capture_output=True, env=env, timeout=60)


def test_cron_mail_on_a_mini_qmail_host_reaches_the_hubs_user(tmp_path, qmail_home, users, daemons):
    bench = users.add("bench")
    daemons.start()
    daemons.wait_line(r"^status: ")
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    with QmqpServer(qmail_home, "--tcp", "127.0.0.1:0") as hub:
        mini = make_mini(tmp_path, "127.0.0.1:%d" % dead_port(), "127.0.0.1:%d" % hub.tcp[1])
        done = cron_sendmail(mini)
        assert done.returncode == 0, done.stderr
        (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert got.endswith(b"\nbackup done\n")
    assert b"\nTo: bench@test.example\n" in got
    # the envelope and the header made on the null client with its control/me
    assert got.startswith(b"Return-Path: <root@mini.example>\nDelivered-To: bench@test.example\n")
    assert b"\nFrom: root@mini.example\n" in got and b".qmail@mini.example>\n" in got


def test_every_hub_down_the_cron_job_sees_a_temporary_failure(tmp_path, qmail_home):
    mini = make_mini(tmp_path, "127.0.0.1:%d" % dead_port())
    done = cron_sendmail(mini)
    assert done.returncode == 75, done          # sendmail's EX_TEMPFAIL: cron keeps and reports it
    assert done.stderr == b"sendmail: fatal: connection to mail server rejected (#4.4.1)\n"
    done = subprocess.run([os.path.join(mini, "bin", "qmail-inject")], input=CRON_MAIL,
                          capture_output=True, env={"QMAILHOME": mini, "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stderr) == (
        111, b"qmail-inject: fatal: connection to mail server rejected (#4.4.1)\n")
    assert leftovers(qmail_home) == []


def test_mini_refuses_names_and_a_home_with_a_queue(tmp_path, qmail_home):
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "qmailctl"), "init", "--home",
                           str(tmp_path / "m"), "--mini", "hub.example.com"], capture_output=True)
    assert done.returncode == 1 and b"IP addresses" in done.stderr
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "qmailctl"), "init", "--home",
                           qmail_home.path, "--mini", "127.0.0.1"], capture_output=True)
    assert done.returncode == 1 and b"has a queue" in done.stderr
