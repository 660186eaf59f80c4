"""A mini-qmail host (`qmailctl init --mini HUB`) and a hub on 127.0.0.1: a cron-style
sendmail on the null client reaches the hub's user; with every hub down the caller
gets qmail's temporary failure and the hub's queue gets nothing."""
import os
import subprocess
import sys

import pytest

from delivery_support import wait_maildir
from net_support import dead_port
from qmqpd_harness import QmqpServer
from queue_view import leftovers

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_check_start_and_stat_know_a_mini_qmail_home(tmp_path):
    # no queue, no accounts, no daemons: check looks at what a null client has, start and
    # stat say there is nothing to run (exit 0), and a listener is refused (nothing to feed)
    mini = make_mini(tmp_path, "127.0.0.1")
    qmailctl = os.path.join(os.path.dirname(sys.executable), "qmailctl")

    def run(*args):
        return subprocess.run([qmailctl, args[0], "--home", mini, *args[1:]], capture_output=True, timeout=60)

    check = run("check")
    assert (check.returncode, check.stdout) == (0, b""), check.stdout.decode()
    start = run("start")
    assert start.returncode == 0 and b"nothing to start" in start.stdout, start
    assert not os.path.exists(os.path.join(mini, "log"))
    stat = run("stat")
    assert stat.returncode == 0 and b"mini-qmail home" in stat.stdout and b": 127.0.0.1\n" in stat.stdout, stat
    listen = run("start", "--smtp", "127.0.0.1:%d" % dead_port())
    assert listen.returncode == 1 and b"need a queue" in listen.stderr, listen
    hub = run("start", "--qmqp", "127.0.0.1:%d" % dead_port())
    assert hub.returncode == 1 and b"need a queue" in hub.stderr, hub
    assert run("stop").returncode == 0

    with open(os.path.join(mini, "control", "qmqpservers"), "w") as f:
        f.write("hub.example.com\n")
    os.chmod(os.path.join(mini, "control", "me"), 0o666)
    check = run("check")
    assert check.returncode == 1
    assert check.stdout.decode().splitlines() == [
        "control/qmqpservers: hub.example.com is not an IP address (qmail-qmqpc skips it)",
        "control/qmqpservers: names no hub: qmail-queue can hand no message on",
        "control/me: mode 0666 is writable by group or others (fix: chmod go-w control/me)"]
