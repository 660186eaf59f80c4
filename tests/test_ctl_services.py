"""qmailctl services under daemontools' svscan (issue 25 point 2: without systemd, a crashed
daemon is started again): kill -9 of each daemon, each comes back by itself; mail still
flows; qmailctl stat sees the supervised daemons; svc -dx leaves no process."""
import os
import shutil
import signal
import smtplib
import subprocess

import psutil
import pytest

from ctl_support import LogFile, ctl, free_port, running_in
from delivery_support import wait_maildir
from lspawn_harness import LocalUsers
from qmailpy.ctl import daemons
from smtpd_support import TIMEOUT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("svscan") is None,
                                 reason="daemontools is not installed (apt-get install daemontools)")]


class ServiceLog(LogFile):
    def __init__(self, home, name):
        super().__init__(home)
        self.logpath = os.path.join(home.path, "log", name)


def stop_services(service_dir):
    """svc -dx every service and its log, once supervise runs for each (svok)."""
    import time
    names = [os.path.join(service_dir, n) for n in os.listdir(service_dir)]
    names += [n + "/log" for n in names]
    deadline = time.monotonic() + 60
    while not all(subprocess.run(["svok", n]).returncode == 0 for n in names):
        assert time.monotonic() < deadline, "supervise did not start for every service"
        time.sleep(0.1)
    subprocess.run(["svc", "-dx"] + names, timeout=60)


def find(home, daemon):
    return daemons.find(os.path.abspath(home.path), daemon)


@pytest.fixture
def service_dir():
    """A directory of our own: pytest sessions running side by side prune each other's
    tmp_path, and supervise must find its directory until svc -x."""
    import pathlib
    import tempfile
    base = tempfile.mkdtemp(prefix="qmailpy-services-")
    try:
        yield pathlib.Path(base) / "service"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_supervised_daemons_come_back_after_kill_9(qmail_home, service_dir):
    port = free_port()
    done = ctl(qmail_home, "services", "--dir", str(service_dir), "--smtp", "127.0.0.1:%d" % port)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(os.listdir(service_dir)) == ["qmail-qmqpd", "qmail-send", "qmail-smtpd"]
    for d in (daemons.QMQPD, daemons.SEND, daemons.SMTPD):       # so that inotify can watch them
        os.close(os.open(os.path.join(qmail_home.path, "log", d.logname), os.O_WRONLY | os.O_CREAT, 0o640))
    scan = subprocess.Popen(["svscan", str(service_dir)], env=qmail_home.env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = {d: ServiceLog(qmail_home, d.logname) for d in (daemons.QMQPD, daemons.SEND, daemons.SMTPD)}
    up = {daemons.QMQPD: r"listening on", daemons.SEND: r"^status: local 0/10", daemons.SMTPD: r"listening on"}
    try:
        for d, log in logs.items():
            log.wait_line(up[d])
        stat = ctl(qmail_home, "stat")
        assert stat.returncode == 0, stat.stdout.decode()
        again = ctl(qmail_home, "start", "--smtp", "127.0.0.1:%d" % port)
        assert again.returncode == 0 and again.stdout.count(b"already running") == 3, again.stdout

        for d in (daemons.SEND, daemons.QMQPD, daemons.SMTPD):
            before = find(qmail_home, d)
            assert before is not None, d.label
            before.send_signal(signal.SIGKILL)
            before.wait(timeout=30)
            logs[d].wait_line(up[d], count=2)                # supervise started it again
            after = find(qmail_home, d)
            assert after is not None and after.pid != before.pid, d.label

        bench = LocalUsers(qmail_home).add("bench")
        with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT) as s:
            s.sendmail("joe@far.example", ["bench@test.example"], b"Subject: supervised\r\n\r\nhi\r\n")
        (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
        assert b"Subject: supervised\n" in got
    finally:
        scan.terminate()                # first: svscan would start a new supervise after svc -x
        scan.wait(timeout=30)
        stop_services(str(service_dir))
        gone, alive = psutil.wait_procs(running_in(qmail_home), timeout=60)
    assert alive == []
    assert psutil.wait_procs(running_in(qmail_home), timeout=30)[1] == []
