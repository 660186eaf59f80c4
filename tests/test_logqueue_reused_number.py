"""Recovery must not clean a body whose number a new message took meanwhile.

Message numbers are mess/ inodes. Recovery replays the FINISH records written after
the last checkpoint and cleans their bodies, since the crash may have come before the
unlink. But when the unlink did happen, the inode may already belong to a new
message whose qmail-queue has written mess/S/n and not yet appended its ENVELOPE:
cleaning then deleted the body of a message about to be acknowledged. Found by
bench/kill_campaign.py (3 of 26,013 acknowledged messages lost in 5,000 kills).

The file system will not hand a chosen inode to a new qmail-queue, so the test plays
that qmail-queue's steps itself, in its order and with its lock: the shared flock on
queue/, the body at mess/S/n, then the ENVELOPE (logenqueue.append_envelope, the
code qmail-queue runs)."""
import fcntl
import os
import shutil
import time

import pytest

from inotify_simple import INotify, flags

from delivery_support import new_msgs, queue, wait_maildir
from lspawn_harness import LocalUsers
from qmailpy.backends.log.enqueue import append_envelope
from qmailpy.trigger import pull
from send_harness import Daemons, wait_mess_gone

pytestmark = pytest.mark.slow

AS_ROOT = os.geteuid() == 0


def after_a_crash_past_an_unlink(home):
    """Deliver one message, then put back the checkpoint from before it, as a crash after
    its body's unlink but before the checkpoint recording it leaves the disk: the next
    start replays its FINISH. Its number n, and mess/S/n (now free) as a path."""
    checkpoint = os.path.join(home.queue, "log", "checkpoint")
    daemons = Daemons(home).start()
    daemons.wait_started()
    assert daemons.stop() == 0
    shutil.copy(checkpoint, checkpoint + ".before")
    daemons = Daemons(home).start()
    daemons.wait_started()
    queue(home, b"joe@test.example", [b"bench@test.example"], b"Subject: first\n\nfirst\n")
    lines = daemons.wait_line(r"^end msg ")
    n = new_msgs(lines)[0]
    wait_mess_gone(home, n)
    assert daemons.stop() == 0
    os.replace(checkpoint + ".before", checkpoint)
    if AS_ROOT:
        os.chown(checkpoint, home.uid, home.gid)
    return n, os.path.join(home.queue, "mess", str(n % 23), str(n))


def write_body(home, path, subject):
    with open(path, "wb") as f:
        f.write(b"Received: (qmail 1 invoked by uid 0); 1 Jan 2026 00:00:00 -0000\n"
                b"Subject: %s\n\n%s\n" % (subject, subject))
    if AS_ROOT:
        os.chown(path, home.uid, home.gid)


def hold_queue(home):
    """What every qmail-queue holds while it runs: a shared flock on queue/."""
    fd = os.open(home.queue, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def log_home(home):
    home.control("queuebackend", "log\n")
    return home, LocalUsers(home).add("bench")


def test_a_replayed_finish_leaves_the_body_of_a_new_message_on_its_number(qmail_home):
    home, bench = log_home(qmail_home)
    n, body = after_a_crash_past_an_unlink(home)
    # a new message on number n, its qmail-queue half way: body written, no ENVELOPE yet
    queue_fd = hold_queue(home)
    write_body(home, body, b"second")
    daemons = Daemons(home).start()
    try:
        daemons.wait_started()
        assert os.path.exists(body), "recovery cleaned the new message's body"
        append_envelope(home.queue, n, 0, 1, b"joe@test.example", [b"bench@test.example"])
        os.close(queue_fd)                                # qmail-queue exits 0
        queue_fd = None
        pull(home.queue)
        got = wait_maildir(os.path.join(bench, "Maildir"), 2)
        daemons.wait_line(r"^end msg ", 2)
    finally:
        if queue_fd is not None:
            os.close(queue_fd)
        daemons.kill()
    assert sorted(m.rsplit(b"\n\n", 1)[1] for m in got) == [b"first\n", b"second\n"]


def test_a_new_message_preprocessed_while_the_clean_waits_keeps_its_body(qmail_home):
    """The clean waits because some qmail-queue is running; meanwhile a new message takes
    number n and is preprocessed and deferred (neither pending nor in flight any more).
    When the clean can run, it must still know that n is in use."""
    home, bench = log_home(qmail_home)
    home.control("smtproutes", "far.example:127.0.0.1:1\n")          # nothing listens: deferred
    n, body = after_a_crash_past_an_unlink(home)
    busy_fd = hold_queue(home)                          # a slow submission elsewhere
    checkpoint = os.path.join(home.queue, "log", "checkpoint")
    daemons = Daemons(home).start()
    try:
        daemons.wait_started()
        write_body(home, body, b"second")
        append_envelope(home.queue, n, 0, 1, b"joe@test.example", [b"r@far.example"])
        pull(home.queue)
        daemons.wait_line(r"^delivery \d+: deferral: ")
        with INotify() as ino:                           # the next checkpoint renames onto it
            ino.add_watch(os.path.dirname(checkpoint), flags.MOVED_TO)
            os.close(busy_fd)                            # now the clean can take the lock
            busy_fd = None
            deadline = time.monotonic() + 30
            while not any(e.name == "checkpoint" for e in ino.read(timeout=1000)):
                assert time.monotonic() < deadline, "no checkpoint"
        assert os.path.exists(body), "the waiting clean removed the new message's body"
    finally:
        if busy_fd is not None:
            os.close(busy_fd)
        daemons.kill()
