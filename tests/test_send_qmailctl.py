"""qmailctl start | stat | doqueue | reload | queue | stop on a test home, with the real
daemons, as an operator would use them."""
import os
import re
import smtplib
import socket

import psutil
import pytest

from ctl_support import LogFile, ctl, free_port, running_in
from delivery_support import wait_maildir
from lspawn_harness import LocalUsers
from qmailpy import logline

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


@pytest.fixture
def started(qmail_home):
    port = free_port()
    qmail_home.control("smtproutes", "closed.example:127.0.0.1:%d\n" % free_port())
    done = ctl(qmail_home, "start", "--smtp", "127.0.0.1:%d" % port)
    try:
        assert done.returncode == 0, done.stderr.decode()
        yield port
    finally:
        ctl(qmail_home, "stop")


def test_start_stat_doqueue_reload_queue_stop(qmail_home, started):
    bench = LocalUsers(qmail_home).add("bench")
    log = LogFile(qmail_home)
    log.wait_line(r"^status: local 0/10 remote 0/20$")
    first = log.raw()[0]
    event = logline.parse(first)
    assert event.time is not None and event.text == "status: local 0/10 remote 0/20"
    assert all(logline.parse(l).time is not None and logline.parse(l).kind != "unknown" for l in log.raw())
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z status: ", first)

    stat = ctl(qmail_home, "stat")
    assert stat.returncode == 0, stat.stderr
    out = stat.stdout.decode()
    for name in ("qmail-send", "qmail-lspawn", "qmail-rspawn", "qmail-clean", "qmail-smtpd-listen",
                 "qmail-qmqpd"):
        assert re.search(r"^\s*%s\s+pid \d+" % name, out, re.M), out
    qmqpd_pid = int(open(os.path.join(qmail_home.path, "log", "qmail-qmqpd.pid")).read())
    qmqp_socket = os.path.join(qmail_home.path, "run", "qmqp.sock")
    assert os.path.exists(qmqp_socket)
    assert "messages in queue: 0\nmessages in queue but not yet preprocessed: 0\n" in out

    # mail through the SMTP listener started with --smtp
    with smtplib.SMTP("127.0.0.1", started, timeout=30) as s:
        s.sendmail("joe@far.example", ["bench@test.example"], b"Subject: via smtp\r\n\r\nhi\r\n")
    (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert b"Subject: via smtp\n" in got

    # a deferral, retried at once by doqueue
    assert qmail_home.queue_message(b"Subject: x\n\ny\n", b"bench@test.example",
                                    [b"nobody@closed.example"]).returncode == 0
    log.wait_line(r"^delivery \d+: deferral: Sorry,_I_wasn't_able_to_establish_an_SMTP_connection")
    queue = ctl(qmail_home, "queue")
    assert queue.returncode == 0
    assert re.search(rb"#\d+  \d+  <bench@test.example> \n\tremote\tnobody@closed.example\n", queue.stdout)
    assert b"messages in queue: 1\n" in queue.stdout
    assert ctl(qmail_home, "doqueue").returncode == 0
    log.wait_line(r"^starting delivery \d+: msg \d+ to remote nobody@closed.example$", 2)

    qmail_home.control("locals", "test.example\nclosed.example\n")
    assert ctl(qmail_home, "reload").returncode == 0
    assert qmail_home.queue_message(b"Subject: x\n\ny\n", b"joe@far.example",
                                    [b"bench@closed.example"]).returncode == 0
    log.wait_line(r"^starting delivery \d+: msg \d+ to local bench@closed.example$")

    send_pid = int(open(os.path.join(qmail_home.path, "log", "qmail-send.pid")).read())
    helpers = psutil.Process(send_pid).children()
    stop = ctl(qmail_home, "stop")
    assert stop.returncode == 0, stop.stderr
    assert log.lines()[-1] == "status: exiting"
    assert not psutil.pid_exists(send_pid) or psutil.Process(send_pid).status() == psutil.STATUS_ZOMBIE
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in helpers)
    stat = ctl(qmail_home, "stat")
    assert stat.returncode == 1 and b"qmail-send: not running" in stat.stdout
    assert b"messages in queue: 1\n" in stat.stdout       # the deferred one waits on disk
    # qmailctl stop stops the queue server too, which removes its socket
    assert b"qmail-qmqpd: not running\n" in stat.stdout
    assert not psutil.pid_exists(qmqpd_pid) or psutil.Process(qmqpd_pid).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(qmqp_socket)


def test_start_twice_and_signals_when_stopped(qmail_home, started):
    again = ctl(qmail_home, "start")          # nothing missing: says what runs, starts nothing
    assert again.returncode == 0, again
    assert re.search(rb"^qmail-qmqpd already running \(pid \d+\)\nqmail-send already running \(pid \d+\)\n$",
                     again.stdout), again.stdout
    assert ctl(qmail_home, "stop").returncode == 0
    for command in ("doqueue", "reload"):
        done = ctl(qmail_home, command)
        assert done.returncode == 1 and b"not running" in done.stderr


def test_doqueue_also_retries_a_message_whose_preprocessing_failed(qmail_home):
    """Preprocessing fails while qmail-send cannot search mess/; the next scan of new
    messages is 25 minutes away, but doqueue promises every message now."""
    assert qmail_home.queue_message(b"Subject: x\n\ny\n", b"joe@far.example",
                                    [b"nobody@closed.example"]).returncode == 0
    mess = os.path.join(qmail_home.queue, "mess")
    splits = [os.path.join(mess, name) for name in os.listdir(mess)]
    for path in splits:
        os.chmod(path, 0)
    try:
        qmail_home.control("smtproutes", "closed.example:127.0.0.1:%d\n" % free_port())
        assert ctl(qmail_home, "start").returncode == 0
        log = LogFile(qmail_home)
        (n,) = [l.split("/")[-1] for l in log.wait_line(r"^warning: unable to stat mess/\d+/\d+$")
                if l.startswith("warning: unable to stat mess/")]
    finally:
        for path in splits:
            os.chmod(path, 0o750)
    try:
        assert ctl(qmail_home, "doqueue").returncode == 0
        log.wait_line(r"^starting delivery \d+: msg %s to remote nobody@closed.example$" % n)
    finally:
        ctl(qmail_home, "stop")


def test_a_start_whose_smtp_listener_fails_stops_everything(qmail_home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = ctl(qmail_home, "start", "--smtp", "127.0.0.1:%d" % port)
    assert done.returncode == 1, done
    assert b"qmailctl: qmail-smtpd-listen 127.0.0.1:%d did not start:" % port in done.stderr, done.stderr
    assert b"qmail-send started" in done.stdout             # it got that far
    assert psutil.wait_procs(running_in(qmail_home), timeout=30)[1] == []
    stat = ctl(qmail_home, "stat")
    assert b"qmail-send: not running\n" in stat.stdout and b"qmail-qmqpd: not running\n" in stat.stdout
    assert not [n for n in os.listdir(os.path.join(qmail_home.path, "log")) if ".pid" in n]
