"""Helpers for the tests of qmailctl queue's commands with the real daemons: run
`qmailctl queue ACTION`, an SMTP peer for PEER that defers what it is told to (the
`peer` fixture), a message that peer deferred once, and SlowDelivery (a delivery held
in flight until the test lets it end).
"""
import os
import re
import subprocess
import time

import pytest
from inotify_simple import INotify, flags

from lspawn_harness import LocalUsers
from remote_harness import Smtpd

PEER = "peer.example"


def ctl(home, *args, **kw):
    return home.run(["qmailctl", "queue", args[0], "--home", home.path, "--timeout", "20"]
                    + list(args[1:]), **kw)


def msg_number(daemons, recipient, count=1):
    lines = daemons.wait_line(r"^starting delivery \d+: msg \d+ to \w+ %s$" % re.escape(recipient), count)
    return int(re.search(r"msg (\d+) to \w+ %s$" % re.escape(recipient),
                         [l for l in lines if l.endswith(" " + recipient)][-1]).group(1))


@pytest.fixture
def peer(qmail_home):
    """An SMTP peer for PEER that defers every recipient in peer.deferred."""
    with Smtpd() as smtpd:
        qmail_home.control("smtproutes", "%s:[127.0.0.1]:%d\n" % (PEER, smtpd.port))
        yield smtpd


def deferred_message(home, daemons, peer, local, sender=b"joe@test.example"):
    """A message to LOCAL@PEER that the peer deferred once: its number."""
    rcpt = "%s@%s" % (local, PEER)
    peer.rcpt_replies[rcpt] = "451 4.3.0 try later"
    assert home.queue_message(b"Subject: %s\n\nhello\n" % local.encode(), sender,
                              [rcpt.encode()]).returncode == 0
    lines = daemons.wait_line(r"^starting delivery \d+: msg \d+ to remote %s$" % re.escape(rcpt))
    start = [l for l in lines if l.endswith(" " + rcpt)][-1]
    d, n = (int(x) for x in re.match(r"starting delivery (\d+): msg (\d+)", start).groups())
    daemons.wait_line(r"^delivery %d: deferral: " % d)
    return n


class SlowDelivery:
    """A message to slow@ (a |program delivery that waits on a FIFO until go()) and
    other@ (a Maildir), with concurrencylocal 1: while slow@'s delivery is in flight,
    other@'s waits behind it."""

    def __init__(self, home):
        users = LocalUsers(home)
        work = os.path.dirname(home.path)
        self.home, self.fifo = home, os.path.join(work, "go")
        self.marker = os.path.join(work, "slow-finished")
        os.mkfifo(self.fifo, 0o666)
        slow = users.add("slow", maildir=False)
        users.dotqmail(slow, "", "|read x < %s; echo done > %s\n" % (self.fifo, self.marker))
        os.chmod(work, 0o777)
        self.other_new = os.path.join(users.add("other"), "Maildir", "new")
        home.control("concurrencylocal", "1\n")

    def queue(self, daemons):
        """Queue the message; its number, once slow@'s delivery has started."""
        assert self.home.queue_message(b"Subject: t\n\nhi\n", b"joe@test.example",
                                       [b"slow@test.example", b"other@test.example"]).returncode == 0
        return msg_number(daemons, "slow@test.example")

    def delete_claimed(self, n):
        """qmailctl queue delete n, once qmail-send has claimed the command: the Popen."""
        cdir = os.path.join(self.home.queue, "command")
        with INotify() as ino:
            ino.add_watch(cdir, flags.MOVED_TO)
            proc = subprocess.Popen(["qmailctl", "queue", "delete", "--home", self.home.path, str(n)],
                                    env=self.home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 30
            while not any(name.endswith(".work") for name in os.listdir(cdir)):
                assert time.monotonic() < deadline, "qmail-send never claimed the command"
                ino.read(timeout=1000)
        return proc

    def go(self, wait=True):
        """Let the |program delivery end; without wait only if it has the FIFO open now."""
        if wait:
            with open(self.fifo, "w") as f:
                f.write("go\n")
            return
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:                  # no reader: no delivery to end
            return
        os.write(fd, b"go\n")
        os.close(fd)
