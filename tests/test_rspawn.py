"""qmail-rspawn (docs/delivery.md "qmail-rspawn"; docs/protocols.md "qmail-send ↔ spawners"): real spawner processes, real SMTP peers, real pipes."""
import os

import pytest

from qmailpy.envelope import safe
from qmailpy.remote.rspawn import report
from remote_harness import Smtpd, closed_port, route
from rspawn_harness import Rspawn, put_message
from shared_data import data_file

SAMPLE = data_file("qmail-send-sample.epoch.log")     # a real C qmail-send log


def assert_in_sample_log(text):
    """qmail-send logs a result text through safe(): it must read exactly as in qmail's log."""
    if SAMPLE is None:
        return
    with open(SAMPLE, "rb") as f:
        assert b": " + safe(text) + b"\n" in f.read(), safe(text)


@pytest.mark.parametrize("output,reply", [
    (b"r\0K1.2.3.4 accepted message.\nRemote host said: 250 ok\n\0",
     b"K1.2.3.4 accepted message.\nRemote host said: 250 ok\n"),
    (b"s1.2.3.4 does not like recipient.\nRemote host said: 451 later\n\0DGiving up on 1.2.3.4.\n\0",
     b"Z1.2.3.4 does not like recipient.\nRemote host said: 451 later\nGiving up on 1.2.3.4.\n"),
    (b"h1.2.3.4 does not like recipient.\nRemote host said: 550 no\n\0DGiving up on 1.2.3.4.\n\0",
     b"D1.2.3.4 does not like recipient.\nRemote host said: 550 no\nGiving up on 1.2.3.4.\n"),
    (b"r\0Z1.2.3.4 failed on DATA command.\n\0", b"Z1.2.3.4 failed on DATA command.\n"),
    (b"r\0DSMTP cannot transfer messages with partial final lines. (#5.6.2)\n\0",
     b"DSMTP cannot transfer messages with partial final lines. (#5.6.2)\n"),
    (b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n\0",
     b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n"),
    (b"s1.2.3.4 x.\n\0r\0K1.2.3.4 accepted message.\n\0", b"Z1.2.3.4 x.\n"),   # K is better than s
    (b"r\0", b"D"),                          # no verdict at all: permanent
    (b"garbage without a NUL", b"D"),
])
def test_report_combines_records(output, reply):
    assert report(0, output) == reply


def test_report_exit_statuses():
    assert report(9, b"") == b"Zqmail-remote crashed.\n"                 # killed by SIGKILL
    assert report(111 << 8, b"x\0") == b"ZUnable to run qmail-remote.\n"
    assert report(100 << 8, b"x\0") == b"DUnable to run qmail-remote.\n"
    assert report(0, b"") == b"Zqmail-remote produced no output.\n"


def test_deliveries_through_rspawn(qmail_home):
    with Smtpd() as peer:
        peer.rcpt_replies["later@x.test"] = "451 4.3.0 responder: try again later"
        peer.rcpt_replies["nobody@x.test"] = "550 5.1.1 responder: no such user here"
        route(qmail_home, "x.test", peer.port)
        m = put_message(qmail_home, 457, b"Subject: hi\n\n.dot\nbody \xe9\n")
        rs = Rspawn(qmail_home)
        assert rs.greeting == bytes([120])
        rs.command(0, m, b"a@b.example", b"joe@x.test")
        rs.command(1, m, b"a@b.example", b"later@x.test")
        rs.command(2, m, b"a@b.example", b"nobody@x.test")
        rs.command(3, m, b"a@b.example", b"nohost")
        rs.command(4, m, b"", b"ann@x.test")
        got = rs.replies(5)
        rs.finish()
    assert got[0] == b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"
    assert got[1] == (b"Z127.0.0.1 does not like recipient.\n"
                      b"Remote host said: 451 4.3.0 responder: try again later\nGiving up on 127.0.0.1.\n")
    assert got[2] == (b"D127.0.0.1 does not like recipient.\n"
                      b"Remote host said: 550 5.1.1 responder: no such user here\nGiving up on 127.0.0.1.\n")
    assert got[3] == b"DSorry, address must include host name. (#5.1.3)\n"
    assert got[4][:1] == b"K"
    # the recipients the peer took, the body as qmail-remote sends it
    assert sorted((t.mail_from, tuple(t.rcpt_tos)) for t in peer.transactions) == [
        ("<>", ("ann@x.test",)), ("a@b.example", ("joe@x.test",))]
    assert {t.data for t in peer.transactions} == {b"Subject: hi\r\n\r\n.dot\r\nbody \xe9\r\n"}
    # qmail-send logs these texts with safe(); they read exactly as the real qmail log does
    for text in (got[1][1:], got[2][1:], got[0][1:].replace(b"Ok: queued", b"Ok")):
        assert_in_sample_log(text)


def test_connection_refused_and_tcpto_cleared_at_start(qmail_home):
    tcpto = os.path.join(qmail_home.queue, "lock", "tcpto")
    with open(tcpto, "wb") as f:
        f.write(b"\x7f\0\0\x01\x0a\0\0\0" + b"\xff" * 4 + bytes(4) + b"\x55" * 1008)
    route(qmail_home, "x.test", closed_port())
    m = put_message(qmail_home, 1000, b"Subject: hi\n\nbody\n")
    rs = Rspawn(qmail_home)
    rs.command(7, m, b"a@b.example", b"joe@x.test")
    got = rs.replies(1)
    rs.finish()
    assert got[7] == b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n"
    assert_in_sample_log(got[7][1:])
    assert open(tcpto, "rb").read() == bytes(1024)


@pytest.mark.slow
def test_no_program_is_executed_per_delivery(qmail_home):
    """Without $QMAILREMOTE the delivery runs in a delivery worker: no qmail-remote on PATH needed."""
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        m = put_message(qmail_home, 2000, b"Subject: hi\n\nbody\n")
        env = dict(qmail_home.env, PATH="/nonexistent")
        env.pop("QMAILREMOTE", None)
        rs = Rspawn(qmail_home, env=env)
        for slot in range(20):
            rs.command(slot, m, b"a@b.example", b"u%d@x.test" % slot)
        got = rs.replies(20)
        rs.finish()
    assert all(r.startswith(b"K127.0.0.1 accepted message.") for r in got.values())
    assert sorted(r for t in peer.transactions for r in t.rcpt_tos) == sorted(
        "u%d@x.test" % i for i in range(20))


def test_qmailremote_program_is_executed(qmail_home, tmp_path):
    script = tmp_path / "fake-remote"
    script.write_text('#!/bin/sh\nprintf "r\\0K%s|%s|%s|%s\\0" "$0" "$1" "$2" "$3"\n')
    script.chmod(0o755)
    m = put_message(qmail_home, 3000, b"Subject: hi\n\nbody\n")
    rs = Rspawn(qmail_home, env=dict(qmail_home.env, QMAILREMOTE=str(script)))
    rs.command(0, m, b"s@a.example", b"r@B.Example")
    got = rs.replies(1)
    rs.finish()
    assert got[0] == b"K%s|B.Example|s@a.example|r@B.Example" % str(script).encode()

    rs = Rspawn(qmail_home, env=dict(qmail_home.env, QMAILREMOTE=str(tmp_path / "missing")))
    rs.command(0, m, b"s@a.example", b"r@b.example")
    got = rs.replies(1)
    rs.finish()
    assert got[0] == b"DUnable to run qmail-remote.\n"


def test_message_with_wrong_owner_is_deferred(qmail_home):
    if os.geteuid() != 0:
        pytest.skip("only root can create a file owned by someone else")
    m = put_message(qmail_home, 4000, b"x\n")
    os.chown(os.path.join(qmail_home.queue, "mess", m.decode()), 0, 0)
    rs = Rspawn(qmail_home)
    rs.command(0, m, b"a@b", b"c@d")
    assert rs.replies(1)[0] == b"ZSorry, message has wrong owner. (#4.3.5)\n"
    rs.finish()
