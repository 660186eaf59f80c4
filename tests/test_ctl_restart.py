"""`qmailctl start` run again after a crash (issue 25): with no supervisor, the administrator
(or cron) runs the same start again; it starts what is missing, says what already runs, and
stops nothing it did not start. `stat` exits 1 while a daemon is down. A log that rotates on
its first line does not fail a start."""
import os
import re
import shutil
import signal
import smtplib
import subprocess
import sys
import tempfile

import psutil
import pytest

from ctl_support import ctl, free_port, running_in
from delivery_support import wait_maildir
from lspawn_harness import LocalUsers
from qmailpy.ctl.daemons import QMQPD_PID, SEND_PID
from qmailpy.logfiles import log_set
from root_paths_support import as_attacker, unchanged, victim  # noqa: F401 (fixture)
from smtpd_support import TIMEOUT
from smtpd_tls_support import certs, tls_home  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

PIDS = {"qmail-qmqpd": "qmail-qmqpd.pid", "qmail-send": "qmail-send.pid",
        "smtp": "qmail-smtpd.pid", "submission": "qmail-submission.pid"}
PROGRAM = {"qmail-qmqpd": "qmail-qmqpd", "qmail-send": "qmail-send",
           "smtp": "qmail-smtpd-listen", "submission": "qmail-smtpd-listen"}


def pid_of(home, name):
    with open(os.path.join(home.path, "log", PIDS[name])) as f:
        return int(f.read())


def pids(home):
    return {name: pid_of(home, name) for name in PIDS}


def kill9(pid):
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def server(tls_home):
    smtp, submission = free_port(), free_port()
    command = ("start", "--smtp", "127.0.0.1:%d" % smtp, "--submission", "127.0.0.1:%d" % submission)
    done = ctl(tls_home, *command)
    try:
        assert done.returncode == 0, done.stderr.decode()
        yield tls_home, command, smtp, submission
    finally:
        ctl(tls_home, "stop")


def test_the_same_start_after_each_kill_restarts_only_the_dead_one(server, certs):
    home, command, smtp, submission = server
    for victim in ("qmail-qmqpd", "qmail-send", "smtp", "submission"):
        before = pids(home)
        helpers = psutil.Process(before["qmail-send"]).children() if victim == "qmail-send" else []
        kill9(before[victim])
        assert psutil.wait_procs(helpers, timeout=30)[1] == []     # they end when qmail-send does
        stat = ctl(home, "stat")
        assert stat.returncode == 1, stat.stdout.decode()
        again = ctl(home, *command)
        out = again.stdout.decode()
        assert again.returncode == 0, (victim, out, again.stderr.decode())
        after = pids(home)
        assert after[victim] != before[victim]
        assert re.search(r"^%s started" % PROGRAM[victim], out, re.M), out
        for other in PIDS:
            if other != victim:
                assert after[other] == before[other], (victim, other)
                assert psutil.Process(after[other]).is_running()
        assert out.count("already running") == 3, out
        assert ctl(home, "stat").returncode == 0

    # pid files gone: the daemons are found by what they run, and the files written again
    for name in ("qmail-qmqpd", "smtp"):
        os.unlink(os.path.join(home.path, "log", PIDS[name]))
    again = ctl(home, *command)
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout.decode().count("already running") == 4, again.stdout
    assert b"qmail-qmqpd.pid restored" in again.stdout and b"qmail-smtpd.pid restored" in again.stdout
    final = pids(home)
    assert all(psutil.Process(pid).is_running() for pid in final.values())

    # mail through every entry point: SMTP, submission (TLS and AUTH), sendmail
    bench = LocalUsers(home).add("bench")
    with smtplib.SMTP("127.0.0.1", smtp, timeout=TIMEOUT) as s:
        s.sendmail("joe@far.example", ["bench@test.example"], b"Subject: via smtp\r\n\r\nhi\r\n")
    with smtplib.SMTP("127.0.0.1", submission, timeout=TIMEOUT) as s:
        s.starttls(context=certs.client_context())
        s.login("alice", "s3cret")
        s.sendmail("alice@test.example", ["bench@test.example"], b"Subject: via submission\r\n\r\nhi\r\n")
    sent = home.run(["sendmail", "-f", "joe@test.example", "bench@test.example"],
                    input=b"Subject: via sendmail\n\nhi\n")
    assert sent.returncode == 0, sent.stderr
    got = wait_maildir(os.path.join(bench, "Maildir"), 3)
    assert sorted(re.search(rb"Subject: via (\w+)", m).group(1) for m in got) == [
        b"sendmail", b"smtp", b"submission"]

    stop = ctl(home, "stop")
    assert stop.returncode == 0, stop.stderr
    assert psutil.wait_procs(running_in(home), timeout=30)[1] == []
    assert not [n for n in os.listdir(os.path.join(home.path, "log")) if n.endswith(".pid")]


def test_a_start_whose_log_rotates_on_its_first_line(qmail_home):
    qmail_home.control("logsize", "4096\n")
    logdir = os.path.join(qmail_home.path, "log")
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "qmail-send.log"), "wb") as f:
        f.write(b"2026-01-01T00:00:00.000000Z status: exiting\n" * 92)     # 4048 bytes
    done = ctl(qmail_home, "start")
    try:
        assert done.returncode == 0, done.stderr.decode()
        assert b"qmail-send started" in done.stdout
        logs = log_set(logdir, "qmail-send.log")
        assert len(logs) >= 2                                    # it did rotate
        with open(logs[-1], "rb") as f:
            assert b" status: local 0/10 remote 0/20\n" in f.read()
    finally:
        stop = ctl(qmail_home, "stop")
    assert stop.returncode == 0, stop.stderr


def test_a_fifo_named_like_a_rotated_log_does_not_hang_start(qmail_home):
    """qmailctl start reads the log's new lines, rotations included, to see a daemon come
    up: a FIFO that the home's user left under a rotated log's name is passed over."""
    logdir = os.path.join(qmail_home.path, "log")
    os.makedirs(logdir, exist_ok=True)
    os.mkfifo(os.path.join(logdir, "qmail-send.@0000000000000000.log"))
    try:
        done = ctl(qmail_home, "start")
    finally:
        stop = ctl(qmail_home, "stop")
    assert done.returncode == 0 and b"qmail-send started" in done.stdout, done.stderr.decode()
    assert stop.returncode == 0, stop.stderr


def test_stop_by_an_account_that_may_not_signal_says_so(qmail_home):
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemons must run as an account other than the caller's")
    lock = os.path.join(qmail_home.path, "log", "qmailctl.lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    os.close(os.open(lock, os.O_WRONLY | os.O_CREAT, 0o644))       # as an earlier qmailctl made it
    assert ctl(qmail_home, "start").returncode == 0
    try:
        # flock needs only a descriptor: a lock every user could open, any could hold for ever
        hold = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; "
                               "fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX)", lock],
                              capture_output=True, timeout=60, user="daemon", group="daemon", extra_groups=[])
        assert hold.returncode == 1 and b"PermissionError" in hold.stderr, hold
        done = subprocess.run(["qmailctl", "stop", "--home", qmail_home.path], env=qmail_home.env,
                              capture_output=True, timeout=60, user="daemon", group="daemon",
                              extra_groups=[])
        err = done.stderr.decode()
        assert done.returncode == 1 and "Traceback" not in err, err
        assert re.match(r"qmailctl: permission denied: qmail-\w+ \(pid \d+\) runs as another account", err), err
        assert ctl(qmail_home, "stat").returncode == 0           # nothing was stopped
    finally:
        assert ctl(qmail_home, "stop").returncode == 0


def test_root_neither_stops_nor_adopts_another_accounts_look_alike(qmail_home, tmp_path):
    # Any user can run a Python script named qmail-send with QMAILHOME set to the home;
    # root reads every process's environment, so only the account a daemon runs as marks it
    if os.geteuid() != 0:
        pytest.skip("needs root: only root reads another account's environment")
    base = tempfile.mkdtemp(prefix="lookalike")
    try:
        os.chmod(base, 0o755)
        script = os.path.join(base, "qmail-send")
        with open(script, "w") as f:
            f.write("import sys\nsys.stdin.read()\n")
        os.chmod(script, 0o755)
        fake = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE, user="daemon",
                                group="daemon", extra_groups=[], cwd="/",
                                env=dict(qmail_home.env, QMAILHOME=os.path.abspath(qmail_home.path)))
        try:
            stat = ctl(qmail_home, "stat")
            assert stat.returncode == 1 and b"qmail-send: not running" in stat.stdout, stat.stdout
            stop = ctl(qmail_home, "stop")
            assert stop.returncode == 0 and b"nothing is running" in stop.stdout, stop
            assert fake.poll() is None                  # not signalled
        finally:
            fake.stdin.close()
            assert fake.wait(timeout=30) == 0
    finally:
        shutil.rmtree(base)


def test_root_reads_and_writes_pid_files_by_no_link_and_waits_on_no_fifo(qmail_home, victim):  # noqa: F811
    # a single-user home is its user's: log/ can be renamed away and the user's own put in its
    # place, holding a FIFO where root reads a pid file and a link where root writes one
    if os.geteuid() != 0:
        pytest.skip("root's paths in another account's directory")
    plant = as_attacker(qmail_home, OWN_LOG_DIR, qmail_home.path, SEND_PID, QMQPD_PID + ".tmp", victim)
    assert plant.wait(timeout=30) == 0
    plant.stdout.close()
    try:
        start = qmail_home.run(["qmailctl", "start"], timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl start hung on a FIFO at log/qmail-send.pid")
    try:
        assert start.returncode == 0, start.stderr.decode()
        assert unchanged(victim)
        for name in ("qmail-qmqpd", "qmail-send"):
            assert psutil.Process(pid_of(qmail_home, name)).is_running()
    finally:
        stop = ctl(qmail_home, "stop")
    assert stop.returncode == 0, stop.stderr
    assert not [n for n in os.listdir(os.path.join(qmail_home.path, "log")) if n.endswith((".pid", ".tmp"))]


OWN_LOG_DIR = r"""
import os, sys
home, fifo, link, target = sys.argv[1:]
log = os.path.join(home, "log")
if os.path.isdir(log):
    os.rename(log, log + ".old")
os.mkdir(log)
os.mkfifo(os.path.join(log, fifo))
os.symlink(target, os.path.join(log, link))
"""


def test_root_runs_no_program_of_a_single_user_homes_bin(qmail_home):
    # the home's user owns bin/ and its launchers: a qmail-start of theirs, run by root's
    # qmailctl start, would run as root; root takes its own installation's programs instead
    if os.geteuid() != 0:
        pytest.skip("root and another account's programs")
    pwned = os.path.join(qmail_home.path, "pwned")
    plant = as_attacker(qmail_home, "import os, sys\n"
                        "tmp = sys.argv[1] + '.new'\n"
                        "with open(tmp, 'w') as f:\n"
                        "    f.write('#!/bin/sh\\nid -u > %s\\nexit 1\\n' % sys.argv[2])\n"
                        "os.chmod(tmp, 0o755)\n"
                        "os.rename(tmp, sys.argv[1])\n",
                        os.path.join(qmail_home.path, "bin", "qmail-start"), pwned)
    assert plant.wait(timeout=30) == 0
    plant.stdout.close()
    start = ctl(qmail_home, "start")
    try:
        assert not os.path.exists(pwned), "root ran the user's bin/qmail-start"
        assert start.returncode == 0, start.stderr.decode()
        send = psutil.Process(pid_of(qmail_home, "qmail-send"))
        assert send.uids().real == qmail_home.uid
        assert not any(os.path.dirname(part) == os.path.join(qmail_home.path, "bin") for part in send.cmdline())
    finally:
        stop = ctl(qmail_home, "stop")
    assert stop.returncode == 0, stop.stderr


def test_roots_check_waits_on_no_fifo_in_a_single_user_homes_bin(qmail_home):
    if os.geteuid() != 0:
        pytest.skip("root and another account's directory")
    launcher = os.path.join(qmail_home.path, "bin", "qmail-send")
    plant = as_attacker(qmail_home, "import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1])", launcher)
    assert plant.wait(timeout=30) == 0
    plant.stdout.close()
    try:
        done = qmail_home.run(["qmailctl", "check", "--home", qmail_home.path], timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl check hung on a FIFO at bin/qmail-send")
    assert b"Traceback" not in done.stderr, done.stderr
