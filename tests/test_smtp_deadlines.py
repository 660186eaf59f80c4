"""Hostile peers that keep every single wait short: deadlines and per-client limits.

qmail bounds each read and write (timeoutsmtpd, timeoutremote) but nothing else,
so a client trickling one byte a second, or a server dripping its replies, holds
a session for ever. qmail-smtpd has deadlines for the whole session
(control/timeoutsmtpdsession) and for one DATA (control/timeoutsmtpddata),
qmail-remote one for its SMTP session (control/timeoutremotesession), and
qmail-smtpd-listen refuses a client address more than -s sessions at once
(421), as the SMTP socket unit does with MaxConnectionsPerSource.
"""
import select
import socket
import time

import pytest

from net_support import needs_ipv6
from queue_view import queued
from remote_harness import ScriptedPeer, qmail_remote, route
from smtpd_support import TIMEOUT, ListenerProcess, assert_nothing_queued, open_data, start

TIMEOUT_REPLY = b"451 timeout (#4.4.2)\r\n"
PER_SOURCE = b"421 too many connections from your address (#4.3.2)\r\n"


def trickle(s, data, interval, limit):
    """Send data one byte every `interval` seconds until the server answers (at most
    `limit` seconds); (what it answered, seconds it took)."""
    t = time.monotonic()
    for i in range(len(data)):
        if time.monotonic() - t > limit:
            break
        try:
            s.send(data[i:i + 1])
        except OSError:          # the server closed; its reply is waiting
            break
        readable, _, _ = select.select([s.client], [], [], interval)
        if readable:
            break
    return rest(s), time.monotonic() - t


def rest(s):
    """What the server wrote before closing. A byte of ours it never read makes the
    close a reset (ECONNRESET after its data), which is not the server's fault."""
    data = s.pending
    try:
        while True:
            chunk = s.client.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    s.pending = b""
    return data


@pytest.mark.slow
def test_a_client_trickling_data_one_byte_at_a_time_is_cut_off(qmail_home):
    qmail_home.control("timeoutsmtpd", "5")          # every single wait is far shorter
    qmail_home.control("timeoutsmtpddata", "2")
    with start(qmail_home) as s:
        open_data(s)
        answer, took = trickle(s, b"Subject: slow\r\n\r\n" + b"x" * 100, 0.25, 15)
        assert answer == TIMEOUT_REPLY
        assert s.close() == 1
        assert s.stderr == b""
    assert 1.5 < took < 4, took
    assert_nothing_queued(qmail_home)


@pytest.mark.slow
def test_a_client_trickling_commands_is_cut_off_at_the_session_deadline(qmail_home):
    qmail_home.control("timeoutsmtpd", "5")
    qmail_home.control("timeoutsmtpdsession", "2")
    with start(qmail_home) as s:
        t = time.monotonic()
        while time.monotonic() - t < 10:
            try:
                s.send(b"NOOP\r\n")
            except OSError:         # closed after the 451, which is waiting to be read
                pass
            reply = s.reply()
            if reply != b"250 ok\r\n":
                break
            time.sleep(0.2)
        took = time.monotonic() - t
        assert reply == TIMEOUT_REPLY
        assert s.close() == 1
    assert 1.5 < took < 4, took


@pytest.mark.slow
def test_the_data_deadline_ends_with_the_data(qmail_home):
    """A quick DATA leaves the session deadline in force, not DATA's."""
    qmail_home.control("timeoutsmtpddata", "1")
    with start(qmail_home) as s:
        open_data(s)
        assert s.command(b"Subject: quick\r\n\r\nhi\r\n.\r\n").startswith(b"250 ok ")
        time.sleep(1.5)
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    assert len(queued(qmail_home)) == 1


@pytest.mark.slow
def test_a_data_cut_off_by_the_session_deadline_queues_nothing(qmail_home):
    qmail_home.control("timeoutsmtpd", "5")
    qmail_home.control("timeoutsmtpdsession", "2")
    with start(qmail_home) as s:
        open_data(s)
        answer, took = trickle(s, b"Subject: slow\r\n\r\n" + b"x" * 100, 0.25, 15)
        assert answer == TIMEOUT_REPLY
    assert took < 3, took
    assert_nothing_queued(qmail_home)


def greeting(port, host="127.0.0.1"):
    s = socket.create_connection((host, port), timeout=TIMEOUT)
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = s.recv(100)
        if not chunk:
            break
        data += chunk
    return s, data


def test_one_client_address_gets_at_most_s_sessions(qmail_home):
    with ListenerProcess(qmail_home, "-c", "5", "-s", "2") as listener:
        first, said = greeting(listener.port)
        assert said == b"220 test.example ESMTP\r\n"
        second, said = greeting(listener.port)
        assert said == b"220 test.example ESMTP\r\n"
        third, said = greeting(listener.port)
        assert said == PER_SOURCE
        assert third.recv(100) == b""                  # and closed
        third.close()
        first.sendall(b"QUIT\r\n")
        assert first.recv(100) == b"221 test.example\r\n"
        first.close()
        deadline = time.monotonic() + TIMEOUT         # until the listener has reaped it
        while True:
            again, said = greeting(listener.port)
            if said != PER_SOURCE or time.monotonic() > deadline:
                break
            again.close()
            time.sleep(0.05)
        assert said == b"220 test.example ESMTP\r\n"
        again.close()
        second.close()


def test_the_default_per_client_limit_is_half_the_sessions(qmail_home):
    with ListenerProcess(qmail_home, "-c", "4") as listener:
        held = [greeting(listener.port) for _ in range(3)]
        assert [said for _, said in held] == [b"220 test.example ESMTP\r\n"] * 2 + [PER_SOURCE]
        for s, _ in held:
            s.close()


def test_usage_errors_of_s(qmail_home):
    for args in (["-s", "0", "127.0.0.1:25"], ["-s", "x", "127.0.0.1:25"], ["-s"]):
        done = qmail_home.run(["qmail-smtpd-listen", *args])
        assert done.returncode == 100
        assert b"[ -s perclient ]" in done.stderr


@needs_ipv6
def test_a_dual_stack_listener_counts_ipv4_clients_by_their_ipv4_address(qmail_home):
    with ListenerProcess(qmail_home, "-c", "5", "-s", "1", address="::") as listener:
        v4, said = greeting(listener.port, "127.0.0.1")
        assert said == b"220 test.example ESMTP\r\n"
        again, said = greeting(listener.port, "127.0.0.1")
        assert said == PER_SOURCE
        other, said = greeting(listener.port, "::1")         # another address: its own count
        assert said == b"220 test.example ESMTP\r\n"
        for s in (v4, again, other):
            s.close()


@pytest.mark.slow
def test_a_server_dripping_its_greeting_is_left_at_the_session_deadline(qmail_home):
    qmail_home.control("timeoutremote", "2\n")               # each byte comes well within it
    qmail_home.control("timeoutremotesession", "2\n")
    with ScriptedPeer([("drip", b"220 " + b"x" * 200 + b"\r\n", 0.25)]) as peer:
        route(qmail_home, "x.test", peer.port)
        t = time.monotonic()
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        took = time.monotonic() - t
        assert peer.done.wait(30)
    assert records == [b"ZConnected to 127.0.0.1 but the SMTP session outlasted "
                       b"control/timeoutremotesession. (#4.4.2)\n"]
    assert took < 5, took


@pytest.mark.slow
def test_a_server_dripping_its_reply_to_the_dot_may_have_the_message(qmail_home):
    qmail_home.control("timeoutremote", "2\n")
    qmail_home.control("timeoutremotesession", "2\n")
    script = [("send", b"220 p\r\n"), ("line",), ("send", b"250 p\r\n"), ("line",),
              ("send", b"250 ok\r\n"), ("line",), ("send", b"250 ok\r\n"), ("line",),
              ("send", b"354 go\r\n"), ("data",), ("drip", b"250 " + b"y" * 200 + b"\r\n", 0.25)]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"r", b"ZConnected to 127.0.0.1 but the SMTP session outlasted "
                       b"control/timeoutremotesession. Possible duplicate! (#4.4.2)\n"]
    assert peer.received[0].endswith(b"\r\n.\r\n")


@pytest.mark.slow
def test_no_session_deadline_when_it_is_0(qmail_home):
    qmail_home.control("timeoutremote", "2\n")
    qmail_home.control("timeoutremotesession", "0\n")
    script = [("drip", b"220 p\r\n", 0.5), ("line",), ("send", b"250 p\r\n"), ("line",),
              ("send", b"250 ok\r\n"), ("line",), ("send", b"250 ok\r\n"), ("line",),
              ("send", b"354 go\r\n"), ("data",), ("send", b"250 taken\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"r", b"K127.0.0.1 accepted message.\nRemote host said: 250 taken\n"]
