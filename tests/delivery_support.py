"""Helpers for the end-to-end delivery tests: queue a message through qmail-queue, read
qmail-send's log for new messages, wait (inotify) for and read a Maildir's new/ messages.
"""
import os
import time

from inotify_simple import INotify, flags

MSG = b"Subject: e2e\n\nhello there\n"


def queue(home, sender, recipients, message=MSG):
    done = home.queue_message(message, sender, recipients)
    assert done.returncode == 0, done.stderr
    return done


def new_msgs(lines):
    return [int(l.split()[2]) for l in lines if l.startswith("new msg ")]


def maildir_messages(maildir):
    new = os.path.join(maildir, "new")
    out = []
    for name in sorted(os.listdir(new)):
        with open(os.path.join(new, name), "rb") as f:
            out.append(f.read())
    return out


def wait_maildir(maildir, count, timeout=30):
    """Wait (inotify on new/) until count messages are in maildir/new."""
    new = os.path.join(maildir, "new")
    with INotify() as ino:
        ino.add_watch(new, flags.CREATE | flags.MOVED_TO)
        deadline = time.monotonic() + timeout
        while len(os.listdir(new)) < count:
            left = deadline - time.monotonic()
            assert left > 0, "only %d of %d messages in %s" % (len(os.listdir(new)), count, new)
            ino.read(timeout=int(min(left, 1.0) * 1000))
    return maildir_messages(maildir)
