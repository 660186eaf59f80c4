"""qmailctl start when it cannot record a daemon's pid (a full disk): the daemon it
just spawned is stopped, with everything started before it, so that stat and stop do
not later call "not running" what runs; one line on stderr says why, no traceback."""
import errno
import os
import subprocess

import psutil
import pytest

from conftest import AS_ROOT


def ctl(home, *args):
    return home.run(["qmailctl", args[0], "--home", home.path] + list(args[1:]))


def running_in(home):
    """Processes whose command line names the home (daemons, helpers, log writers)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE \
                and any(home.path in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


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
    """HOME/log on a 64 KB tmpfs; fill(pages) leaves that many 4 KB pages free."""
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
