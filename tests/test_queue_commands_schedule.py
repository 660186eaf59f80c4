"""qmailctl queue bounce leaves nothing of the message in the backend's schedule
(docs/qmail-send.md "Commands"): a message deferred once waits in the schedule for its
retry; after the bounce ends it, that retry must not open a pass on a message that is
gone (or on a later message given the same number)."""
import signal

import pytest

from queue_commands_support import ctl, deferred_message, peer  # noqa: F401  (fixture)
from send_harness import Daemons

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def test_bounce_leaves_no_retry_behind(qmail_home, peer):  # noqa: F811
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        other = deferred_message(qmail_home, daemons, peer, "amy")
        done = ctl(qmail_home, "bounce", "--reason", "Gone.", str(n))
        assert (done.returncode, done.stdout) == (0, b"%d: bounced 1 recipient\n" % n)
        daemons.wait_line(r"^end msg %d$" % n)
        peer.rcpt_replies.clear()
        daemons.signal(signal.SIGALRM)                 # every retry waiting is due now
        lines = daemons.wait_line(r"^end msg %d$" % other)
        after = lines[lines.index("end msg %d" % n):]
        assert [l for l in after if l.startswith("warning:")] == []
    finally:
        daemons.kill()
