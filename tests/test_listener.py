"""qmail-smtpd-listen: a forking listener that runs qmail-smtpd without tcpserver."""
import os
import re
import select
import smtplib
import socket

import pytest

from queue_view import queued
from smtpd_support import TIMEOUT, ListenerProcess, no_relay_env, relay, reporting_queue, write_rules

REFUSED = (553, b"sorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)")


@pytest.mark.slow
def test_smtplib_sends_a_message_through_the_listener(qmail_home):
    with ListenerProcess(qmail_home) as listener:
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            code, text = client.ehlo("client.example")
            assert code == 250
            # a home from qmailctl init has its shipped databytes
            assert text.split(b"\n") == [b"test.example", b"PIPELINING", b"SIZE 26214400", b"SMTPUTF8",
                                              b"8BITMIME"]
            refused = client.sendmail("me@test.example", ["you@test.example"],
                                      b"Subject: via smtplib\r\n\r\nhello\r\n.starts with dot\r\n")
            assert refused == {}
        assert listener.stop() == 0
    [msg] = queued(qmail_home)
    assert msg.sender == b"me@test.example"
    assert msg.recipients == [b"you@test.example"]
    body = msg.body_after_received(1)
    assert re.match(rb"Received: from unknown \(HELO client\.example\) \(127\.0\.0\.1\)\n"
                    rb"  by test\.example with SMTP; ", body), body
    assert msg.body_after_received() == b"Subject: via smtplib\n\nhello\n.starts with dot\n"


@pytest.mark.slow
def test_child_gets_the_tcpserver_environment(qmail_home):
    # A replacement qmail-queue reports the environment back through qmail's fd-6 protocol.
    env = reporting_queue(qmail_home, "$PROTO", "$TCPREMOTEIP", "$TCPREMOTEPORT", "$TCPLOCALIP",
                          "$TCPLOCALPORT", "$TCPLOCALHOST")
    with ListenerProcess(qmail_home, "-l", "mx.test.example", env=env) as listener:
        client = smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT)
        client.helo("c")
        client.mail("a@b.example")
        client.rcpt("x@test.example")
        code, text = client.data(b"hi\r\n")
        local_port = client.sock.getsockname()[1]
        client.quit()
    assert code == 554
    assert text == b"TCP|127.0.0.1|%d|127.0.0.1|%d|mx.test.example" % (local_port, listener.port)


def accept_queue(port):
    """Connections waiting in the accept queue of the socket listening on 127.0.0.1:port.

    For a listening socket /proc/net/tcp's rx_queue is the count of connections the
    kernel has completed and the listener has not accepted yet.
    """
    local = "0100007F:%04X" % port
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[3] == "0A":
                return int(fields[4].split(":")[1], 16)
    raise AssertionError("nothing listens on 127.0.0.1:%d" % port)


# How long the held connection must stay unaccepted. Accepting and forking take
# milliseconds, so a listener ignoring its limit would be caught well within it;
# a correct listener never accepts, so the window cannot make the test fail spuriously.
HOLD_WINDOW = 0.5


@pytest.mark.slow
def test_connection_limit_holds_further_connections_until_one_ends(qmail_home):
    with ListenerProcess(qmail_home, "-c", "1") as listener:
        first = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT)
        assert first.recv(100) == b"220 test.example ESMTP\r\n"
        second = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT)
        # The handshake is done (create_connection returned), so the kernel has queued it.
        assert accept_queue(listener.port) == 1
        readable, _, _ = select.select([second], [], [], HOLD_WINDOW)
        assert readable == [], "second session started while the first one was running"
        assert accept_queue(listener.port) == 1, "listener accepted beyond its limit"
        first.sendall(b"QUIT\r\n")
        assert first.recv(100) == b"221 test.example\r\n"
        first.close()
        assert second.recv(100) == b"220 test.example ESMTP\r\n"
        assert accept_queue(listener.port) == 0
        second.close()


def test_sigterm_stops_the_listener(qmail_home):
    listener = ListenerProcess(qmail_home)
    with listener:
        port = listener.port
        assert listener.stop() == 0
    try:
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError("listener still accepting after SIGTERM")


@pytest.mark.slow
def test_usage_errors_exit_100(qmail_home):
    for args in ([], ["nohostport"], ["-c", "x", "127.0.0.1:25"], ["127.0.0.1:port"]):
        done = qmail_home.run(["qmail-smtpd-listen", *args])
        assert done.returncode == 100
        assert done.stderr.startswith(b"qmail-smtpd-listen: usage: ")


# --- per-client rules (control/smtpclients) ---------------------------------------


def assert_relay_refused(port, source="127.0.0.1"):
    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        relay(port, source)
    assert refused.value.recipients == {"far@elsewhere.example": REFUSED}


def stderr_line(listener):
    ready, _, _ = select.select([listener.proc.stderr], [], [], TIMEOUT)
    assert ready, "no line from the listener within %ds" % TIMEOUT
    return listener.proc.stderr.readline()


@pytest.mark.slow
def test_client_matching_no_rule_may_not_relay(qmail_home):
    write_rules(qmail_home, '192.168.1.:allow,RELAYCLIENT=""\n10.0.0.1:allow,RELAYCLIENT=""\n')
    with ListenerProcess(qmail_home, env=no_relay_env(qmail_home)) as listener:
        assert_relay_refused(listener.port)
    assert queued(qmail_home) == []


@pytest.mark.slow
def test_allow_rule_with_relayclient_lets_that_client_relay(qmail_home):
    write_rules(qmail_home, '# relaying for this host only\n127.0.0.1:allow,RELAYCLIENT=""\n')
    with ListenerProcess(qmail_home, env=no_relay_env(qmail_home)) as listener:
        assert relay(listener.port) == {}
        assert_relay_refused(listener.port, source="127.0.0.2")
    [msg] = queued(qmail_home)
    assert msg.recipients == [b"far@elsewhere.example"]
    assert msg.body_after_received() == b"Subject: relay\n\nhi\n"


@pytest.mark.slow
def test_deny_rule_closes_the_connection_before_the_greeting(qmail_home):
    # The exact address wins over the prefix, whatever the order of the lines (as in tcpserver).
    write_rules(qmail_home, '127.:deny\n127.0.0.1:allow,RELAYCLIENT=""\n')
    with ListenerProcess(qmail_home, env=no_relay_env(qmail_home)) as listener:
        denied = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT,
                                          source_address=("127.0.0.2", 0))
        assert denied.recv(100) == b""
        denied.close()
        assert relay(listener.port) == {}
    assert len(queued(qmail_home)) == 1


def test_ranges_and_the_empty_address(qmail_home):
    write_rules(qmail_home, '127.0.0.3-9:deny\n127.0.0.1-2:allow,RELAYCLIENT=""\n:deny\n')
    with ListenerProcess(qmail_home, env=no_relay_env(qmail_home)) as listener:
        assert relay(listener.port, source="127.0.0.2") == {}
        for source in ("127.0.0.9", "127.0.0.10"):
            sock = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT,
                                            source_address=(source, 0))
            assert sock.recv(100) == b"", source
            sock.close()


def test_rules_file_is_reread_when_it_changes(qmail_home):
    with ListenerProcess(qmail_home, env=no_relay_env(qmail_home)) as listener:
        assert_relay_refused(listener.port)
        write_rules(qmail_home, '127.0.0.1:allow,RELAYCLIENT=""\n')
        assert relay(listener.port) == {}
        write_rules(qmail_home, '127.0.0.1:allow,RELAYCLIENT="\n')
        assert relay(listener.port) == {}
        assert stderr_line(listener) == (
            b"qmail-smtpd-listen: warning: unable to parse %s/control/smtpclients: line 1: "
            b'127.0.0.1:allow,RELAYCLIENT="; previous rules kept\n' % qmail_home.path.encode())
        os.unlink(os.path.join(qmail_home.path, "control", "smtpclients"))
        assert_relay_refused(listener.port)
    assert len(queued(qmail_home)) == 2


def test_unparsable_rules_file_stops_the_listener_at_start(qmail_home):
    write_rules(qmail_home, "127.0.0.1:allow\n127.0.0.2\n")
    done = qmail_home.run(["qmail-smtpd-listen", "127.0.0.1:0"])
    assert done.returncode == 111
    assert done.stderr == (b"qmail-smtpd-listen: fatal: unable to parse %s/control/smtpclients: "
                           b"line 2: 127.0.0.2\n" % qmail_home.path.encode())
