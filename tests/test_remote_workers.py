"""qmail-rspawn's delivery workers: several recipients in one transaction, connections kept.

A real aiosmtpd peer on 127.0.0.1 (remote_harness.Smtpd) records every
transaction with the client's (address, port), which tells connections apart,
and every QUIT.
"""
import os
import signal

import psutil

import pytest

from remote_harness import WAIT, Smtpd, route
from rspawn_harness import Rspawn, put_message


def test_recipients_of_one_message_share_a_transaction_and_keep_their_own_replies(qmail_home):
    with Smtpd() as peer:
        peer.rcpt_replies["nobody@x.test"] = "550 5.1.1 responder: no such user here"
        peer.rcpt_replies["later@x.test"] = "451 4.3.0 responder: try again later"
        route(qmail_home, "x.test", peer.port)
        m = put_message(qmail_home, 4000, b"Subject: hi\n\nbody\n")
        rs = Rspawn(qmail_home)
        rs.commands([(0, m, b"a@b.example", b"ann@x.test"), (1, m, b"a@b.example", b"nobody@x.test"),
                     (2, m, b"a@b.example", b"later@x.test"), (3, m, b"a@b.example", b"bob@X.TEST")])
        got = rs.replies(4)
        rs.finish()
    [t] = peer.transactions
    assert (t.mail_from, t.rcpt_tos) == ("a@b.example", ["ann@x.test", "bob@X.TEST"])
    assert got[0] == got[3] == b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"
    # what a qmail-remote run for each refused recipient alone would have reported
    assert got[1] == (b"D127.0.0.1 does not like recipient.\n"
                      b"Remote host said: 550 5.1.1 responder: no such user here\nGiving up on 127.0.0.1.\n")
    assert got[2] == (b"Z127.0.0.1 does not like recipient.\n"
                      b"Remote host said: 451 4.3.0 responder: try again later\nGiving up on 127.0.0.1.\n")


def test_other_senders_and_other_domains_are_other_transactions(qmail_home):
    with Smtpd() as peer:
        qmail_home.control("smtproutes", "x.test:[127.0.0.1]:%d\ny.test:[127.0.0.1]:%d\n"
                           % (peer.port, peer.port))
        m = put_message(qmail_home, 4001, b"Subject: hi\n\nbody\n")
        rs = Rspawn(qmail_home)
        rs.commands([(0, m, b"a@b.example", b"ann@x.test"), (1, m, b"c@b.example", b"bob@x.test"),
                     (2, m, b"a@b.example", b"cat@y.test"), (3, m, b"a@b.example", b"dan@x.test")])
        got = rs.replies(4)
        rs.finish()
    assert all(reply[:1] == b"K" for reply in got.values()), got
    assert sorted((t.mail_from, tuple(t.rcpt_tos)) for t in peer.transactions) == [
        ("a@b.example", ("ann@x.test", "dan@x.test")), ("a@b.example", ("cat@y.test",)),
        ("c@b.example", ("bob@x.test",))]


def test_more_recipients_than_the_limit_take_more_transactions(qmail_home):
    from qmailpy.remote.workerpool import RCPT_LIMIT
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        m = put_message(qmail_home, 4002, b"Subject: hi\n\nbody\n")
        rs = Rspawn(qmail_home)
        count = RCPT_LIMIT + 3
        rs.commands([(k, m, b"a@b.example", b"u%d@x.test" % k) for k in range(count)])
        got = rs.replies(count)
        rs.finish()
    assert all(reply[:1] == b"K" for reply in got.values())
    assert sorted(len(t.rcpt_tos) for t in peer.transactions) == [3, RCPT_LIMIT]


def test_a_report_larger_than_a_packet_reaches_every_recipient(qmail_home):
    # 40 recipients refused with 4 KB replies each: a report of 170 KB, which no
    # SOCK_SEQPACKET packet holds; every recipient used to get 'qmail-remote crashed'
    # (a deferral, again at every retry) instead of its own refusal
    text = "\r\n".join("550-5.1.1 " + "x" * 70 for _ in range(55)) + "\r\n550 5.1.1 no such user"
    count = 40
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        for k in range(count):
            peer.rcpt_replies["u%d@x.test" % k] = text
        m = put_message(qmail_home, 4003, b"Subject: hi\n\nbody\n")
        rs = Rspawn(qmail_home)
        rs.commands([(k, m, b"a@b.example", b"u%d@x.test" % k) for k in range(count)])
        got = rs.replies(count)
        rs.finish()
    said = b"Remote host said: " + text.replace("\r\n", "\n").encode() + b"\n"
    expected = b"D127.0.0.1 does not like recipient.\n" + said + b"Giving up on 127.0.0.1.\n"
    assert sum(len(reply) for reply in got.values()) > 65536
    assert [got[k] for k in range(count)] == [expected] * count


@pytest.mark.slow
def test_the_next_message_to_the_same_peer_reuses_the_connection(qmail_home):
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        rs = Rspawn(qmail_home)
        for n in range(3):
            m = put_message(qmail_home, 4010 + n, b"Subject: %d\n\nbody\n" % n)
            rs.command(0, m, b"a@b.example", b"ann@x.test")
            assert rs.replies(1)[0][:1] == b"K"
        # kept at most cache.IDLE seconds without use, then QUIT
        assert peer.quit_seen.wait(WAIT)
        m = put_message(qmail_home, 4013, b"Subject: 3\n\nbody\n")
        rs.command(0, m, b"a@b.example", b"ann@x.test")
        assert rs.replies(1)[0][:1] == b"K"
        rs.finish()
    clients = [t.client for t in peer.transactions]
    assert clients[0] == clients[1] == clients[2] != clients[3], clients
    assert peer.quits[0] == clients[0]


def test_a_kept_connection_the_peer_closed_is_replaced(qmail_home):
    """The peer drops the kept connection (its own idle timeout): RSET fails, and the
    message goes out on a new connection, not deferred."""
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        rs = Rspawn(qmail_home)
        m = put_message(qmail_home, 4020, b"Subject: 0\n\nbody\n")
        rs.command(0, m, b"a@b.example", b"ann@x.test")
        assert rs.replies(1)[0][:1] == b"K"
        for conn in psutil.Process(rs.proc.pid).children()[0].net_connections("tcp"):
            if conn.raddr and conn.raddr.port == peer.port:
                kept = conn.laddr.port
        peer.drop_client(kept)
        m = put_message(qmail_home, 4021, b"Subject: 1\n\nbody\n")
        rs.command(0, m, b"a@b.example", b"ann@x.test")
        assert rs.replies(1)[0] == (b"K127.0.0.1 accepted message.\n"
                                    b"Remote host said: 250 2.0.0 Ok: queued\n")
        rs.finish()
    assert [t.client[1] for t in peer.transactions][0] == kept
    assert peer.transactions[1].client[1] != kept


def test_a_worker_killed_mid_delivery_fails_each_of_its_recipients_temporarily(qmail_home):
    with Smtpd() as peer:
        peer.data_delay = WAIT              # the worker waits for the reply to the dot
        route(qmail_home, "x.test", peer.port)
        m = put_message(qmail_home, 4030, b"Subject: hi\n\nbody\n")
        rs = Rspawn(qmail_home)
        rs.commands([(0, m, b"a@b.example", b"ann@x.test"), (1, m, b"a@b.example", b"bob@x.test")])
        assert peer.in_data.wait(WAIT)      # the dot is sent, its reply not yet
        [worker] = psutil.Process(rs.proc.pid).children()
        os.kill(worker.pid, signal.SIGKILL)
        got = rs.replies(2)
        peer.data_delay = 0
        m2 = put_message(qmail_home, 4031, b"Subject: again\n\nbody\n")
        rs.command(0, m2, b"a@b.example", b"ann@x.test")
        again = rs.replies(1)
        rs.finish()
    assert got == {0: b"Zqmail-remote crashed.\n", 1: b"Zqmail-remote crashed.\n"}
    assert again[0][:1] == b"K"
