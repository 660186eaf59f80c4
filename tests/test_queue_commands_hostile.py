"""What qmail-send trusts in queue/command/ (docs/qmail-send.md "Commands"): only regular
files, opened without following a symbolic link and without blocking, so a FIFO or a link
left there (by anyone who could write the directory) cannot stop qmail-send."""
import os

import pytest

from queue_commands_support import ctl, deferred_message, peer  # noqa: F401  (fixture)
from send_harness import Daemons

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def test_fifo_and_symlink_in_the_command_channel(qmail_home, peer, tmp_path):  # noqa: F811
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        cdir = os.path.join(qmail_home.queue, "command")
        os.mkfifo(os.path.join(cdir, "0"))                  # sorts before qmailctl's name
        elsewhere = str(tmp_path / "fifo")
        os.mkfifo(elsewhere)
        os.symlink(elsewhere, os.path.join(cdir, "00"))
        done = ctl(qmail_home, "hold", str(n))
        assert (done.returncode, done.stdout) == (0, b"%d: held\n" % n)
        warnings = [l for l in daemons.lines() if l.startswith("warning: command/")]
        assert "warning: command/0.work: not a regular file; ignored" in warnings
        assert any(l.startswith("warning: command/00.work: ") for l in warnings), warnings
        assert os.listdir(cdir) == [] and os.path.exists(elsewhere)
        assert daemons.proc.poll() is None
    finally:
        daemons.kill()
