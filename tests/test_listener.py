"""qmail-smtpd-listen: a forking listener that runs qmail-smtpd without tcpserver."""
import os
import re
import select
import smtplib
import socket

from test_smtpd_support import TIMEOUT, ListenerProcess, queued


def test_smtplib_sends_a_message_through_the_listener(qmail_home):
    with ListenerProcess(qmail_home) as listener:
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            code, text = client.ehlo("client.example")
            assert code == 250
            assert text.split(b"\n") == [b"test.example", b"PIPELINING", b"SIZE", b"8BITMIME"]
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


def test_child_gets_the_tcpserver_environment(qmail_home):
    # A replacement qmail-queue reports the environment back through qmail's fd-6 protocol.
    script = os.path.join(qmail_home.path, "envqueue")
    with open(script, "w") as f:
        f.write('#!/bin/sh\ncat >/dev/null\nprintf "D%s|%s|%s|%s|%s|%s" "$PROTO" "$TCPREMOTEIP" '
                '"$TCPREMOTEPORT" "$TCPLOCALIP" "$TCPLOCALPORT" "$TCPLOCALHOST" >&6\nexit 82\n')
    os.chmod(script, 0o755)
    env = dict(qmail_home.env, QMAILQUEUE=script)
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


def test_connection_limit_holds_further_connections_until_one_ends(qmail_home):
    with ListenerProcess(qmail_home, "-c", "1") as listener:
        first = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT)
        assert first.recv(100) == b"220 test.example ESMTP\r\n"
        second = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT)
        readable, _, _ = select.select([second], [], [], 0.5)
        assert readable == [], "second session started while the first one was running"
        first.sendall(b"QUIT\r\n")
        assert first.recv(100) == b"221 test.example\r\n"
        first.close()
        assert second.recv(100) == b"220 test.example ESMTP\r\n"
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


def test_usage_errors_exit_100(qmail_home):
    for args in ([], ["nohostport"], ["-c", "x", "127.0.0.1:25"], ["127.0.0.1:port"]):
        done = qmail_home.run(["qmail-smtpd-listen", *args])
        assert done.returncode == 100
        assert done.stderr.startswith(b"qmail-smtpd-listen: usage: ")
