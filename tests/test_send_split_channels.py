"""A message whose local channel is deferred while its remote delivery is still running.

On the log backend the message leaves flight when the remote channel finishes (the
local one waits for its retry); qmail-send then asked channels_left() of a message no
longer in flight and logged "message N is not in flight". finish_channel() now says
which channels are left. Found by bench/kill_campaign.py."""
import os
import signal
import threading

import pytest

from delivery_support import queue
from lspawn_harness import LocalUsers
from remote_harness import ScriptedPeer
from send_harness import Daemons

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


class GatedPeer(ScriptedPeer):
    """Plays the script up to ("gate", event), waits for the event, then plays the rest."""

    def _play(self, conn, got):
        script = self.script
        i = next(k for k, step in enumerate(script) if step[0] == "gate")
        try:
            self.script = script[:i]
            ScriptedPeer._play(self, conn, got)
            script[i][1].wait(30)
            self.script = script[i + 1:]
            ScriptedPeer._play(self, conn, got)
        finally:
            self.script = script


def test_remote_success_after_a_local_deferral_leaves_the_local_retry(qmail_home):
    home = qmail_home
    users = LocalUsers(home)
    bench = users.add("bench")
    users.dotqmail(bench, "", "|exit 111\n")            # local: deferred
    gate = threading.Event()
    peer = GatedPeer([("send", b"220 peer\r\n"), ("line",), ("send", b"250 hi\r\n"),
                      ("line",), ("send", b"250 ok\r\n"), ("line",), ("send", b"250 ok\r\n"),
                      ("line",), ("send", b"354 go\r\n"), ("data",), ("gate", gate),
                      ("send", b"250 queued\r\n"), ("line",), ("send", b"221 bye\r\n")])
    home.control("smtproutes", "far.example:127.0.0.1:%d\n" % peer.port)
    daemons = Daemons(home).start()
    try:
        daemons.wait_started()
        queue(home, b"joe@test.example", [b"bench@test.example", b"r@far.example"])
        daemons.wait_line(r"^delivery \d+: deferral: ")      # while the remote one waits at the gate
        gate.set()
        daemons.wait_line(r"^delivery \d+: success: 127\.0\.0\.1_accepted_message")
        users.dotqmail(bench, "", "./Maildir/\n")
        daemons.signal(signal.SIGALRM)
        lines = daemons.wait_line(r"^end msg ")
    finally:
        daemons.kill()
    assert not [line for line in lines if line.startswith(("warning:", "alert:"))]
    assert len(os.listdir(os.path.join(bench, "Maildir", "new"))) == 1
    assert len(peer.received) == 1                       # the remote recipient once
