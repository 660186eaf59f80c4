"""qmailctl on a full disk. When start cannot record a daemon's pid, the daemon it
just spawned is stopped, with everything started before it, so that stat and stop do
not later call "not running" what runs; one line on stderr says why, no traceback.
When HOME/log fills while the daemons run, the log writer pauses and loses no line."""
import errno
import os
import re
import subprocess
import time

import psutil
import pytest
from inotify_simple import INotify, flags

from conftest import AS_ROOT
from ctl_support import LogFile, ctl, running_in

pytestmark = pytest.mark.slow

STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z \S")


def assert_failed_cleanly(home, done, pidfile, reason, obstacle=()):
    err = done.stderr.decode()
    assert done.returncode == 1, done
    assert "Traceback" not in err, err
    assert "qmailctl: cannot write %s: %s;" % (os.path.join(home.path, "log", pidfile), reason) in err, err
    assert psutil.wait_procs(running_in(home), timeout=30)[1] == []
    stat = ctl(home, "stat")
    assert b"qmail-send: not running\n" in stat.stdout and b"qmail-qmqpd: not running\n" in stat.stdout
    assert [n for n in os.listdir(os.path.join(home.path, "log")) if ".pid" in n] == list(obstacle)


def test_an_unwritable_send_pid_file_stops_qmail_send_and_qmail_qmqpd(qmail_home):
    os.makedirs(os.path.join(qmail_home.path, "log", "qmail-send.pid"))     # rename(2) onto it fails
    done = ctl(qmail_home, "start")
    assert b"qmail-qmqpd started" in done.stdout                            # it got that far
    assert_failed_cleanly(qmail_home, done, "qmail-send.pid", "Is a directory", obstacle=["qmail-send.pid"])


@pytest.fixture
def full_log_dir(qmail_home):
    """HOME/log on a 64 KB tmpfs; fill(pages) leaves that many 4 KB pages free, its
    result (the filler file) frees them all when removed."""
    if not AS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    logdir = os.path.join(qmail_home.path, "log")
    os.makedirs(logdir, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", logdir], check=True)

    def fill(pages):
        filler = os.path.join(logdir, "filler")
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"x" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
            f.truncate(os.fstat(f.fileno()).st_size - pages * 4096)
        return filler
    try:
        yield fill
    finally:
        ctl(qmail_home, "stop")
        subprocess.run(["umount", "-l", logdir], check=True)


def test_a_full_disk_at_the_first_pid_file_starts_nothing(qmail_home, full_log_dir):
    full_log_dir(0)
    done = ctl(qmail_home, "start")
    assert_failed_cleanly(qmail_home, done, "qmail-qmqpd.pid", "No space left on device")


def test_a_full_disk_at_qmail_send_pid_file_stops_what_started(qmail_home, full_log_dir):
    full_log_dir(2)             # qmail-qmqpd's pid file and its first log line take the two pages
    done = ctl(qmail_home, "start")
    assert b"qmail-qmqpd started" in done.stdout
    assert_failed_cleanly(qmail_home, done, "qmail-send.pid", "No space left on device")


RECIPIENTS = [b"r%d@elsewhere.example" % i for i in range(60)]     # a log far longer than a page


def wait_page_full(path, timeout=60):
    """Wait (inotify) until path ends at a page boundary: on a full tmpfs a write
    fills the file's last page, then fails with ENOSPC."""
    with INotify() as ino:
        ino.add_watch(path, flags.MODIFY)
        deadline = time.monotonic() + timeout
        while os.path.getsize(path) % 4096:
            left = deadline - time.monotonic()
            assert left > 0, "%s never filled its last page" % path
            ino.read(timeout=int(min(left, 1.0) * 1000))


def test_a_log_that_fills_up_loses_no_line_once_space_returns(qmail_home, full_log_dir):
    qmail_home.control("smtproutes", ":127.0.0.1:1\n")       # nothing listens: deferrals
    assert ctl(qmail_home, "start").returncode == 0
    log = LogFile(qmail_home)
    log.wait_line(r"^status: local 0/10 remote 0/20$")
    filler = full_log_dir(0)
    assert qmail_home.queue_message(b"Subject: x\n\ny\n", b"joe@test.example", RECIPIENTS).returncode == 0
    wait_page_full(log.logpath)         # the writer has met the full disk (and died, before)
    os.unlink(filler)
    lines = log.wait_line(r"^delivery \d+: deferral: ", count=len(RECIPIENTS))
    assert all(STAMPED.match(line) for line in log.raw()), log.raw()    # no line torn
    started = sorted(line.rsplit(" ", 1)[1] for line in lines if line.startswith("starting delivery"))
    assert started == sorted(r.decode() for r in RECIPIENTS)
