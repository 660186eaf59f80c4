"""qmailctl convert: a real directory queue to the log backend and back, losing nothing."""
import fcntl
import os
import subprocess

import pytest

from inotify_simple import INotify, flags

from convert_support import build_dir_queue, envelope_files
from qmailpy.backends.dir import listing as dirlist
from qmailpy.backends.log.queue import LogQueue

pytestmark = pytest.mark.slow


def _views(views):
    return [(v.n, v.state, int(v.birth), v.size, v.sender, [(r.done, r.address) for r in v.local],
             [(r.done, r.address) for r in v.remote], v.bouncing) for v in views]


def test_convert_dir_to_log_and_back(qmail_home):
    queue = qmail_home.queue
    ns = build_dir_queue(qmail_home)
    before_files = envelope_files(queue)
    before_views = _views(dirlist.list_messages(queue))

    assert len(before_views) == 3 and "todo/%d" % ns[3] in before_files

    done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--home", qmail_home.path])
    assert done.returncode == 0, done.stderr
    assert b"converting to log [" in done.stderr and b"4/4" in done.stderr
    assert b"4 messages moved to the log backend, verified" in done.stderr
    with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
        assert f.read() == "log\n"
    assert envelope_files(queue) == {}
    lq = LogQueue(qmail_home.path)
    assert _views(lq.list_messages()) == sorted(before_views, key=lambda v: (v[0] % 23, v[0]))
    assert lq.counts() == (4, 1)
    lq.close()

    done = qmail_home.run(["qmailctl", "convert", "--to", "dir", "--home", qmail_home.path])
    assert done.returncode == 0, done.stderr
    assert b"converting to dir [" in done.stderr
    assert envelope_files(queue) == before_files            # bytes and mtimes (birth, next attempt)
    assert os.listdir(os.path.join(queue, "log")) in ([], ["lock", "sync"], ["sync", "lock"])
    with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
        assert f.read() == "dir\n"


def test_convert_refuses_while_qmail_send_runs(qmail_home):
    done = qmail_home.queue_message(b"x\n", b"s@x", [b"r@test.example"])
    assert done.returncode == 0
    before = envelope_files(qmail_home.queue)
    fd = os.open(os.path.join(qmail_home.queue, "lock", "sendmutex"), os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--home", qmail_home.path])
    finally:
        os.close(fd)
    assert done.returncode == 1
    assert b"qmail-send is running" in done.stderr
    assert envelope_files(qmail_home.queue) == before
    assert not os.path.exists(os.path.join(qmail_home.path, "control", "queuebackend"))


def _queue_dir_locked(queue):
    fd = os.open(queue, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _race_convert_with_qmail_queue(qmail_home, to):
    """A qmail-queue that started before `convert --to` finishes its message after:
    the conversion waits for it and its message is in the converted queue."""
    env_r, env_w = os.pipe()
    with INotify() as ino:
        # qmail-queue creates its pid/ file only once it holds its shared lock on queue/
        ino.add_watch(os.path.join(qmail_home.queue, "pid"), flags.CREATE)
        inject = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=env_r, env=qmail_home.env)
        os.close(env_r)
        created = ino.read(timeout=30000)
    convert = None
    try:
        assert created and inject.poll() is None, "qmail-queue made no pid/ file"
        assert _queue_dir_locked(qmail_home.queue)
        convert = subprocess.Popen(["qmailctl", "convert", "--to", to, "--quiet", "--home", qmail_home.path],
                                   stderr=subprocess.PIPE, env=qmail_home.env)
        assert convert.stderr.readline() == (
            b"qmailctl convert: waiting for running qmail-queue processes to finish\n")
        inject.stdin.write(b"Subject: late\n\nlate\n")
        inject.stdin.close()
        os.write(env_w, b"Flate@x.example\0Tlate-%s@r.example\0\0" % to.encode())
        os.close(env_w)
        env_w = None
        assert inject.wait(timeout=30) == 0
        rest = convert.stderr.read()
        assert convert.wait(timeout=60) == 0, rest
    finally:
        if env_w is not None:
            os.close(env_w)
        for proc in (inject, convert):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return rest


def test_convert_waits_for_a_running_qmail_queue_both_ways(qmail_home):
    ns = build_dir_queue(qmail_home)
    rest = _race_convert_with_qmail_queue(qmail_home, "log")
    assert b"5 messages moved to the log backend, verified" in rest
    assert envelope_files(qmail_home.queue) == {}                  # no todo/ file stranded
    lq = LogQueue(qmail_home.path)
    states = lq.latest_states()
    lq.close()
    late = [n for n in states if n not in ns]
    assert len(late) == 1 and states[late[0]]["rec"].recipients == [b"late-log@r.example"]

    rest = _race_convert_with_qmail_queue(qmail_home, "dir")
    assert b"6 messages moved to the dir backend, verified" in rest
    todo = sorted(os.listdir(os.path.join(qmail_home.queue, "todo")))
    assert len(todo) == 3 and str(late[0]) in todo and str(ns[3]) in todo
    with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
        assert f.read() == "dir\n"


CRASH_STEPS = ("marker", "target-half", "target", "switched", "source-half")


def _convert_killed_at(qmail_home, to, step):
    env = dict(qmail_home.env, QMAILPY_CONVERT_CRASH_AT=step)
    done = qmail_home.run(["qmailctl", "convert", "--to", to, "--quiet", "--home", qmail_home.path], env=env)
    assert done.returncode == -9, (step, done.stderr)
    done = qmail_home.run(["qmailctl", "convert", "--to", to, "--quiet", "--home", qmail_home.path])
    assert done.returncode == 0, (step, done.stderr)
    assert not os.path.exists(os.path.join(qmail_home.queue, "lock", "convert"))
    with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
        assert f.read() == to + "\n"
    return done.stderr


def test_convert_killed_at_every_step_is_finished_by_a_rerun(qmail_home):
    queue = qmail_home.queue
    build_dir_queue(qmail_home)
    dir_files = envelope_files(queue)
    views = sorted(_views(dirlist.list_messages(queue)), key=lambda v: (v[0] % 23, v[0]))
    for step in CRASH_STEPS:
        said = _convert_killed_at(qmail_home, "log", step)
        assert (b"finishing an interrupted" in said) == (step in ("switched", "source-half")), step
        assert envelope_files(queue) == {}, step
        lq = LogQueue(qmail_home.path)
        assert _views(lq.list_messages()) == views, step
        assert lq.counts() == (4, 1), step
        lq.close()

        said = _convert_killed_at(qmail_home, "dir", step)
        assert (b"discarding an interrupted" in said) == (step in CRASH_STEPS[:3]), step
        assert envelope_files(queue) == dir_files, step            # bytes and mtimes
        assert [x for x in os.listdir(os.path.join(queue, "log")) if x.endswith(".seg")] == [], step
