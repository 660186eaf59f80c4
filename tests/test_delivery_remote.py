"""End to end through qmail-start with the real qmail-rspawn and qmail-remote, to an
aiosmtpd server on 127.0.0.1 reached through control/smtproutes."""
import math
import os
import signal

import pytest

from delivery_support import wait_maildir
from lspawn_harness import LocalUsers
from queue_view import schedule
from remote_harness import Smtpd
from send_harness import Daemons, wait_mess_gone

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

MSG = b"Subject: remote e2e\n\nline one\n.line with a dot\n"


@pytest.fixture
def smtpd():
    with Smtpd() as server:
        yield server


@pytest.fixture
def daemons(qmail_home, smtpd):
    qmail_home.control("smtproutes", "far.example:127.0.0.1:%d\n" % smtpd.port)
    d = Daemons(qmail_home)
    yield d
    d.kill()


def queue(home, sender, recipients, message=MSG):
    done = home.queue_message(message, sender, recipients)
    assert done.returncode == 0, done.stderr
    return done


def new_msgs(lines):
    return [int(l.split()[2]) for l in lines if l.startswith("new msg ")]


def test_local_to_remote_envelope_and_bytes(qmail_home, smtpd, daemons):
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@test.example", [b"ann@far.example"])
    lines = daemons.wait_line(r"^end msg ")
    n = new_msgs(lines)[0]
    assert "starting delivery 1: msg %d to remote ann@far.example" % n in lines
    assert "delivery 1: success: 127.0.0.1_accepted_message./Remote_host_said:_250_2.0.0_Ok:_queued/" in lines
    (t,) = smtpd.transactions
    assert t.mail_from == "joe@test.example"
    assert t.rcpt_tos == ["ann@far.example"]
    assert t.helo == "test.example"
    assert t.data.startswith(b"Received: (qmail ")
    assert t.data.endswith(b"\r\n" + MSG.replace(b"\n", b"\r\n"))
    wait_mess_gone(qmail_home, n)


def test_4xx_deferred_retried_by_alarm_then_5xx_bounced(qmail_home, smtpd, daemons):
    bench = LocalUsers(qmail_home).add("bench")
    smtpd.rcpt_replies["flaky@far.example"] = "451 4.3.0 try again later"
    smtpd.rcpt_replies["reject@far.example"] = "550 5.1.1 no such user"
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"bench@test.example", [b"flaky@far.example"])
    lines = daemons.wait_line(r"^delivery 1: deferral: ")
    n = new_msgs(lines)[0]
    assert ("delivery 1: deferral: 127.0.0.1_does_not_like_recipient./Remote_host_said:_451_4.3.0_try_again_later/"
            "Giving_up_on_127.0.0.1./") in lines
    def retry():
        birth, dues = schedule(qmail_home, n)
        return birth, dues.get("remote", 0)
    daemons.wait_for(lambda _: retry()[1] >= retry()[0] + 400, what="retry time of the remote channel")
    birth, due = retry()
    assert due - birth == (math.isqrt(due - birth) ) ** 2 and due - birth >= 400
    del smtpd.rcpt_replies["flaky@far.example"]
    daemons.signal(signal.SIGALRM)          # what qmailctl doqueue does
    lines = daemons.wait_line(r"^end msg %d$" % n)
    assert "delivery 2: success: 127.0.0.1_accepted_message./Remote_host_said:_250_2.0.0_Ok:_queued/" in lines
    queue(qmail_home, b"bench@test.example", [b"reject@far.example"])
    lines = daemons.wait_line(r"^bounce msg ")
    assert ("delivery 3: failure: 127.0.0.1_does_not_like_recipient./Remote_host_said:_550_5.1.1_no_such_user/"
            "Giving_up_on_127.0.0.1./") in lines
    (bounce,) = wait_maildir(os.path.join(bench, "Maildir"), 1)
    assert b"<reject@far.example>:\n127.0.0.1 does not like recipient.\nRemote host said: 550 5.1.1 no such user\n" \
           b"Giving up on 127.0.0.1.\n\n--- Below this line is a copy of the message.\n" in bounce
