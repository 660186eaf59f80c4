"""`qmailctl queue delete` while qmail-send is down (docs/queue-operations.md "Deleting while
qmail-send is down"): it logs qmail-send's own `delete msg N` in qmail-send's log, beside a log
writer that may be appending to it, and it never waits on a FIFO planted as lock/sendmutex."""
import os
import subprocess
import sys

import pytest

from queue_view import leftovers, queued
from qmailpy import logline
from qmailpy.ctl.logwriter import MIN_SIZE, iso_now
from qmailpy.logfiles import log_set

pytestmark = pytest.mark.slow

MSG = b"Subject: test\n\nhello\n"
STAMP = len(iso_now()) + 1                 # the log writer's time and a space


def delete(home, *numbers, timeout=60):
    return home.run(["qmailctl", "queue", "delete", "--home", home.path, "--timeout", "5"]
                    + [str(n) for n in numbers], timeout=timeout)


def queue_one(home):
    assert home.queue_message(MSG, b"joe@test.example", [b"bob@test.example"]).returncode == 0
    return max(m.n for m in queued(home))


def send_log(home):
    return os.path.join(home.path, "log", "qmail-send.log")


def logged(home):
    """qmail-send's log, every file of it in order, as logline.parse reads each line."""
    out = []
    for path in log_set(os.path.dirname(send_log(home)), "qmail-send.log"):
        with open(path, "rb") as f:
            out += [logline.parse(line.decode()) for line in f.read().splitlines()]
    return out


@pytest.mark.both_backends
def test_a_delete_while_qmail_send_is_down_is_logged_as_qmail_send_logs_it(qmail_home):
    n = queue_one(qmail_home)
    got = delete(qmail_home, n, n + 1)
    assert (got.returncode, got.stdout) == (1, b"%d: deleted\n" % n), got.stderr
    [event] = logged(qmail_home)
    assert (event.kind, event.fields, event.text) == ("delete msg", {"n": n}, "delete msg %d" % n)
    assert event.time is not None                      # stamped, as the log writer stamps
    assert leftovers(qmail_home) == []


def test_a_log_that_cannot_be_written_deletes_nothing(qmail_home):
    n = queue_one(qmail_home)
    os.makedirs(send_log(qmail_home))                 # not a file: no line could be logged
    got = delete(qmail_home, n)
    assert (got.returncode, got.stdout) == (111, b""), got.stderr
    assert b"its log cannot be written" in got.stderr and b"nothing done" in got.stderr
    assert [m.n for m in queued(qmail_home)] == [n]


def test_the_line_goes_in_beside_a_running_log_writer_which_takes_it_into_account(qmail_home):
    """A supervised writer (qmailctl services' log/run) keeps qmail-send.log open while
    qmail-send is down. qmailctl's line goes in under the log directory's lock, and the
    writer counts it before its next rotation: no file passes control/logsize."""
    qmail_home.control("logsize", "%d\n" % MIN_SIZE)
    n = queue_one(qmail_home)
    path = send_log(qmail_home)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = subprocess.Popen([sys.executable, "-m", "qmailpy.ctl.logwriter", path, str(MIN_SIZE), "10"],
                              stdin=subprocess.PIPE, cwd=os.path.dirname(os.path.dirname(logline.__file__)))
    try:
        writer.stdin.write(b"x" * 3000 + b"\n")
        writer.stdin.flush()
        _wait_size(path, STAMP + 3000 + 1)
        got = delete(qmail_home, n)
        assert got.returncode == 0, got.stderr
        # fills the file to 10 bytes short of logsize without the delete line (40 bytes or
        # more), so it goes to a new file only if the writer counts that line
        writer.stdin.write(b"y" * (MIN_SIZE - 10 - 2 * (STAMP + 1) - 3000) + b"\nlast\n")
        writer.stdin.close()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
    files = log_set(os.path.dirname(path), "qmail-send.log")
    assert all(os.path.getsize(f) <= MIN_SIZE for f in files), [os.path.getsize(f) for f in files]
    texts = [e.text for e in logged(qmail_home)]
    assert texts[1:] == ["delete msg %d" % n, "y" * (MIN_SIZE - 10 - 2 * (STAMP + 1) - 3000), "last"]


def _wait_size(path, size):
    from inotify_simple import INotify, flags
    with INotify() as ino:
        ino.add_watch(os.path.dirname(path), flags.MODIFY | flags.CREATE)
        while not (os.path.exists(path) and os.path.getsize(path) >= size):
            ino.read(timeout=30000)


def test_a_fifo_planted_as_sendmutex_is_refused_not_waited_on(qmail_home):
    # lock/ is qmailq's: opening a FIFO there to write waits for a reader for ever
    n = queue_one(qmail_home)
    mutex = os.path.join(qmail_home.queue, "lock", "sendmutex")
    os.unlink(mutex)
    os.mkfifo(mutex, 0o600)
    if os.geteuid() == 0:
        os.chown(mutex, qmail_home.uid, qmail_home.gid)      # qmails' (the home's account)
    try:
        got = delete(qmail_home, n, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("qmailctl queue delete waited on a FIFO at queue/lock/sendmutex")
    assert (got.returncode, got.stdout) == (111, b""), got.stderr
    assert b"sendmutex: a named pipe, not a file: refused" in got.stderr, got.stderr
    assert [m.n for m in queued(qmail_home)] == [n]
