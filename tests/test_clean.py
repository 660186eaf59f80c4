"""qmail-clean over its pipes (docs/protocols.md "qmail-send ↔ qmail-clean"; docs/queue-format.md "Cleanup (36 h = 129600 s)"): replies, unlinks, the pid/ cleanup."""
import os
import subprocess
import time

import pytest


@pytest.fixture
def clean(qmail_home):
    proc = subprocess.Popen(["qmail-clean"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=qmail_home.env)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def ask(proc, request):
    proc.stdin.write(request)
    proc.stdin.flush()
    return proc.stdout.read(1)


def touch(home, rel, atime=None):
    path = os.path.join(home.queue, rel)
    with open(path, "wb") as f:
        f.write(b"x")
    if atime is not None:
        os.utime(path, (atime, atime))
    return path


@pytest.mark.slow
def test_todo_and_foop_requests_unlink_their_files(qmail_home, clean):
    mess, intd, todo = touch(qmail_home, "mess/7/30"), touch(qmail_home, "intd/30"), touch(qmail_home, "todo/30")
    assert ask(clean, b"todo/30\0") == b"+"
    assert not os.path.exists(intd) and not os.path.exists(todo) and os.path.exists(mess)
    assert ask(clean, b"foop/30\0") == b"+"
    assert not os.path.exists(mess)
    assert ask(clean, b"foop/30\0") == b"+"          # ENOENT is fine
    clean.stdin.close()
    assert clean.wait(timeout=30) == 0


@pytest.mark.slow
@pytest.mark.parametrize("request_", [b"x\0", b"foop/\0", b"foop/12a\0", b"todo/-1\0", b"junk/123\0",
                                      b"foop/" + b"1" * 95 + b"\0"])
def test_bad_requests_get_x(clean, request_):
    assert ask(clean, request_) == b"x"
    assert ask(clean, b"foop/1\0") == b"+"           # the conversation goes on


def test_unlink_failure_gets_bang(qmail_home, clean):
    os.mkdir(os.path.join(qmail_home.queue, "mess", "10", "33"))   # a directory cannot be unlinked
    assert ask(clean, b"foop/33\0") == b"!"


def test_pid_files_older_than_36_hours_are_removed(qmail_home):
    now = time.time()
    old = touch(qmail_home, "pid/123.456.1", atime=now - 129600 - 60)
    young = touch(qmail_home, "pid/124.456.1", atime=now - 3600)
    proc = subprocess.run(["qmail-clean"], input=b"foop/1\0", capture_output=True, env=qmail_home.env,
                          timeout=30)
    assert proc.returncode == 0 and proc.stdout == b"+"
    assert not os.path.exists(old) and os.path.exists(young)
