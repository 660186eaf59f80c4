"""qmailctl convert: a real directory queue to the log backend and back, losing nothing."""
import fcntl
import os
import subprocess

from qmailpy.backends import dirlist
from qmailpy.backends.dirqueue import DirQueue
from qmailpy.backends.logqueue import LogQueue
from qmailpy.clean import CleanClient

from logqueue_harness import route


def _files(queue):
    """{relative path: (bytes, mtime)} of every envelope-side queue file.

    (bounce/n's mtime means nothing to qmail and is not kept.)"""
    out = {}
    for kind in ("todo", "info", "local", "remote", "bounce"):
        for dirpath, _, names in os.walk(os.path.join(queue, kind)):
            for name in names:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    mtime = None if kind == "bounce" else int(os.stat(path).st_mtime)
                    out[os.path.relpath(path, queue)] = (f.read(), mtime)
    return out


def _views(views):
    return [(v.n, v.state, int(v.birth), v.size, v.sender, [(r.done, r.address) for r in v.local],
             [(r.done, r.address) for r in v.remote], v.bouncing) for v in views]


def _build_dir_queue(qmail_home):
    for i in range(4):
        done = qmail_home.queue_message(b"Subject: %d\n\nbody %d\n" % (i, i), b"s%d@x.example" % i,
                                        [b"a%d@test.example" % i, b"b%d@r.example" % i, b"c@r.example"])
        assert done.returncode == 0
    clean = subprocess.Popen(["qmail-clean"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=qmail_home.env)
    try:
        dq = DirQueue(qmail_home.path, cleaner=CleanClient(clean.stdin.fileno(), clean.stdout.fileno()))
        ns = sorted(dq.new_work())
        for n in ns[:3]:
            dq.preprocess(n, route)
        a, b = ns[0], ns[1]
        local = dq.recipients(a, "local")
        dq.mark_done(a, "local", local[0])
        remote = dq.recipients(a, "remote")
        dq.add_bounce_note(a, b"<b0@r.example>:\nno such user\n\n")
        dq.mark_done(a, "remote", remote[0])
        dq.reschedule(a, "remote", 2000000000)
        dq.reschedule(b, "remote", 1900000000)
    finally:
        clean.stdin.close()
        clean.wait(timeout=30)
    return ns


def test_convert_dir_to_log_and_back(qmail_home):
    queue = qmail_home.queue
    ns = _build_dir_queue(qmail_home)
    before_files = _files(queue)
    before_views = _views(dirlist.list_messages(queue))

    assert len(before_views) == 3 and "todo/%d" % ns[3] in before_files

    done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--home", qmail_home.path])
    assert done.returncode == 0, done.stderr
    assert b"converting to log [" in done.stderr and b"4/4" in done.stderr
    assert b"4 messages moved to the log backend, verified" in done.stderr
    with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
        assert f.read() == "log\n"
    assert _files(queue) == {}
    lq = LogQueue(qmail_home.path)
    assert _views(lq.list_messages()) == sorted(before_views, key=lambda v: (v[0] % 23, v[0]))
    assert lq.counts() == (4, 1)
    lq.close()

    done = qmail_home.run(["qmailctl", "convert", "--to", "dir", "--home", qmail_home.path])
    assert done.returncode == 0, done.stderr
    assert b"converting to dir [" in done.stderr
    assert _files(queue) == before_files            # bytes and mtimes (birth, next attempt)
    assert os.listdir(os.path.join(queue, "log")) in ([], ["lock", "sync"], ["sync", "lock"])
    with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
        assert f.read() == "dir\n"


def test_convert_refuses_while_qmail_send_runs(qmail_home):
    done = qmail_home.queue_message(b"x\n", b"s@x", [b"r@test.example"])
    assert done.returncode == 0
    before = _files(qmail_home.queue)
    fd = os.open(os.path.join(qmail_home.queue, "lock", "sendmutex"), os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--home", qmail_home.path])
    finally:
        os.close(fd)
    assert done.returncode == 1
    assert b"qmail-send is running" in done.stderr
    assert _files(qmail_home.queue) == before
    assert not os.path.exists(os.path.join(qmail_home.path, "control", "queuebackend"))
