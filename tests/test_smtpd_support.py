"""The smtpd test helpers' own checks (tests/smtpd_support.py): queued() reads what qmail-queue
put there, SmtpdProcess talks to a real qmail-smtpd."""

import pytest

from queue_view import queued
from smtpd_support import SmtpdProcess

pytestmark = pytest.mark.slow


@pytest.mark.both_backends
def test_queued_reads_a_message_put_there_by_qmail_queue(qmail_home):
    done = qmail_home.queue_message(b"Subject: x\n\nhi\n", b"a@b.example", [b"c@d.example"])
    assert done.returncode == 0, done.stderr
    [msg] = queued(qmail_home)
    assert (msg.sender, msg.recipients) == (b"a@b.example", [b"c@d.example"])
    assert msg.body_after_received(1) == b"Subject: x\n\nhi\n"


def test_smtpd_process_greets_and_quits(qmail_home):
    with SmtpdProcess(qmail_home) as s:
        assert s.reply() == b"220 test.example ESMTP\r\n"
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0

