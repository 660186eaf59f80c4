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

from lspawn_harness import LocalUsers
from send_harness import Daemons, wait_mess_gone
from test_delivery_local import new_msgs, queue, wait_maildir
from qmailpy.backends.logenqueue import append_envelope
from qmailpy.trigger import pull

AS_ROOT = os.geteuid() == 0


def test_a_replayed_finish_leaves_the_body_of_a_new_message_on_its_number(qmail_home):
    home = qmail_home
    home.control("queuebackend", "log\n")
    users = LocalUsers(home)
    bench = users.add("bench")
    checkpoint = os.path.join(home.queue, "log", "checkpoint")
    daemons = Daemons(home).start()
    daemons.wait_started()
    assert daemons.stop() == 0
    shutil.copy(checkpoint, checkpoint + ".before")      # the state a crash would leave

    daemons = Daemons(home).start()
    daemons.wait_started()
    queue(home, b"joe@test.example", [b"bench@test.example"], b"Subject: first\n\nfirst\n")
    lines = daemons.wait_line(r"^end msg ")
    n = new_msgs(lines)[0]
    wait_mess_gone(home, n)
    assert daemons.stop() == 0
    # a crash after the unlink but before the checkpoint that recorded it
    os.replace(checkpoint + ".before", checkpoint)
    if AS_ROOT:
        os.chown(checkpoint, home.uid, home.gid)

    # a new message on number n, its qmail-queue half way: body written, no ENVELOPE yet
    queue_fd = os.open(home.queue, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(queue_fd, fcntl.LOCK_SH)
    body = os.path.join(home.queue, "mess", str(n % 23), str(n))
    with open(body, "wb") as f:
        f.write(b"Received: (qmail 1 invoked by uid 0); 1 Jan 2026 00:00:00 -0000\n"
                b"Subject: second\n\nsecond\n")
    if AS_ROOT:
        os.chown(body, home.uid, home.gid)
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
