"""qmail's own reception checks, end to end: smtplib -> qmail-smtpd-listen -> queue ->
qmail-send -> Maildir (and, for bounces to a remote sender, an SMTP peer on 127.0.0.1)."""
import os
import smtplib

import pytest

from delivery_support import wait_maildir
from remote_harness import Smtpd
from smtpd_support import TIMEOUT, ListenerProcess

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


@pytest.fixture
def listener(qmail_home):
    with ListenerProcess(qmail_home) as lp:
        yield lp


def test_helo_mail_rcpt_data_lands_in_the_maildir(qmail_home, users, daemons, listener):
    me = users.add("me")
    daemons.start()
    daemons.wait_line(r"^status: ")
    client = smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT)
    assert client.helo("client.example") == (250, b"test.example")
    assert client.docmd("MAIL", "FROM:<me@test.example>") == (250, b"ok")
    assert client.docmd("RCPT", "TO:<me@test.example>") == (250, b"ok")
    assert client.docmd("DATA") == (354, b"go ahead")
    client.send(b"Subject: reception\r\n\r\nit works\r\n.\r\n")
    code, text = client.getreply()
    assert code == 250 and text.startswith(b"ok ") and b" qp " in text
    client.quit()
    (got,) = wait_maildir(os.path.join(me, "Maildir"), 1)
    head, body = got.split(b"\n\n", 1)
    lines = head.split(b"\n")
    assert lines[0] == b"Return-Path: <me@test.example>"
    assert lines[1] == b"Delivered-To: me@test.example"
    assert lines[2].startswith(b"Received: (qmail ")
    assert lines[3] == b"Received: from unknown (HELO client.example) (127.0.0.1)"
    assert lines[4].startswith(b"  by test.example with SMTP; ")
    assert lines[5:] == [b"Subject: reception"]
    assert body == b"it works\n"


def test_postmaster_in_any_capitalisation(qmail_home, users, daemons, listener):
    bench = users.add("bench")
    users.write(os.path.join(qmail_home.path, "alias", ".qmail-postmaster"), "&bench@test.example\n")
    daemons.start()
    daemons.wait_line(r"^status: ")
    with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
        assert client.sendmail("joe@far.example", ["PoStMaStEr@Test.Example"],
                               b"Subject: pm\r\n\r\nhi\r\n") == {}
    (got,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert b"Subject: pm\n\nhi\n" in got


def test_nonexistent_local_user_from_remote_sender_is_bounced(qmail_home, users, daemons,
                                                              listener):
    with Smtpd() as peer:
        qmail_home.control("smtproutes", "remote.example:127.0.0.1:%d\n" % peer.port)
        daemons.start()
        daemons.wait_line(r"^status: ")
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            assert client.sendmail("someone@remote.example", ["nosuchuser@test.example"],
                                   b"Subject: lost\r\n\r\nwhere am I\r\n") == {}
        daemons.wait_line(r"^end msg ", 2, timeout=60)
        lines = daemons.lines()
        assert "delivery 1: failure: Sorry,_no_mailbox_here_by_that_name._(#5.1.1)/" in lines
        assert any(l.startswith("delivery 2: success: ") for l in lines)
        [bounce] = peer.transactions
    assert bounce.mail_from == "<>" or bounce.mail_from == ""
    assert bounce.rcpt_tos == ["someone@remote.example"]
    assert b"<nosuchuser@test.example>:\r\nSorry, no mailbox here by that name. (#5.1.1)" \
        in bounce.data
    assert b"Subject: lost" in bounce.data
