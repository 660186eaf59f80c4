"""qmail-smtpd-listen on a dual-stack socket (::): IPv4 clients arrive as ::ffff:a.b.c.d.
They must meet control/smtpclients' IPv4 rules and keep their RELAYCLIENT, and be named
by their IPv4 address; real IPv6 clients get PROTO=TCP6, as tcpserver's IPv6 version
sets it. And control/maxrcpt bounds the recipients of one message (default 1000)."""
import smtplib
import socket
import subprocess

import pytest

from net_support import needs_ipv6
from queue_view import queued
from smtpd_support import TIMEOUT, ListenerProcess, SmtpdProcess, no_relay_env, relay, reporting_queue, write_rules


def env_script(home):
    """A qmail-queue stand-in that reports the session's environment through fd 6."""
    return reporting_queue(home, "$PROTO", "$TCPREMOTEIP", "$TCP6REMOTEIP", "$TCPLOCALIP")


def session_env(port, host):
    client = smtplib.SMTP(host, port, timeout=TIMEOUT)
    client.helo("c")
    client.mail("a@b.example")
    client.rcpt("x@test.example")
    code, text = client.data(b"hi\r\n")
    client.quit()
    assert code == 554
    return text.split(b"|")


@pytest.mark.slow
@needs_ipv6
def test_an_ipv4_client_of_a_dual_stack_listener_meets_the_ipv4_rules(qmail_home):
    write_rules(qmail_home, '127.0.0.1:allow,RELAYCLIENT=""\n127.0.0.2:deny\n')
    with ListenerProcess(qmail_home, env=no_relay_env(qmail_home), address="::") as listener:
        assert relay(listener.port) == {}                            # RELAYCLIENT kept
        denied = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT,
                                          source_address=("127.0.0.2", 0))
        assert denied.recv(100) == b""                               # the deny rule holds
        denied.close()
    [msg] = queued(qmail_home)
    assert b"(127.0.0.1)" in msg.mess.split(b"\n")[1]               # named by its IPv4 address


@needs_ipv6
def test_tcpserver_environment_for_ipv4_and_ipv6_clients(qmail_home):
    with ListenerProcess(qmail_home, env=env_script(qmail_home), address="::") as listener:
        assert session_env(listener.port, "127.0.0.1") == [b"TCP", b"127.0.0.1", b"", b"127.0.0.1"]
        assert session_env(listener.port, "::1") == [b"TCP6", b"::1", b"::1", b"::1"]


def test_maxrcpt_refuses_recipients_beyond_it_with_452(qmail_home):
    qmail_home.control("maxrcpt", "2\n")
    with SmtpdProcess(qmail_home) as s:
        s.reply()
        s.command(b"HELO c\r\n")
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"RCPT TO:<one@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<two@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<three@test.example>\r\n") == b"452 sorry, too many recipients (#4.5.3)\r\n"
        s.command(b"DATA\r\n")
        assert s.command(b"hi\r\n.\r\n").startswith(b"250 ")
        # a new message starts a new count
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"RCPT TO:<three@test.example>\r\n") == b"250 ok\r\n"
    [msg] = queued(qmail_home)
    assert msg.recipients == [b"one@test.example", b"two@test.example"]


def test_maxrcpt_0_leaves_only_the_queues_byte_bound(qmail_home):
    """Without control/maxrcpt the cap is 1000 (tests/test_queue_limits.py); 0 lifts it."""
    qmail_home.control("maxrcpt", "0\n")
    with SmtpdProcess(qmail_home) as s:
        s.reply()
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        for i in range(1200):
            s.send(b"RCPT TO:<r%d@test.example>\r\n" % i)
        assert all(s.reply() == b"250 ok\r\n" for _ in range(1200))


@pytest.mark.slow
@needs_ipv6
@pytest.mark.parametrize("client", ["127.0.0.1", "::1"])
def test_socket_activation_on_a_dual_stack_socket_sets_the_same_variables(qmail_home, client):
    """qmail-smtpd started as qmail-smtpd@.service starts it: the connection on fds 0/1,
    REMOTE_ADDR and REMOTE_PORT as Accept=yes sets them, no TCP variables."""
    server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    with socket.create_connection((client, server.getsockname()[1]), timeout=TIMEOUT) as peer:
        conn, addr = server.accept()
        server.close()
        env = {k: v for k, v in env_script(qmail_home).items()
               if not k.startswith("TCP") and k not in ("PROTO", "RELAYCLIENT", "DATABYTES")}
        env.update(REMOTE_ADDR=addr[0], REMOTE_PORT=str(addr[1]))
        proc = subprocess.Popen(["qmail-smtpd"], stdin=conn, stdout=conn, env=env)
        conn.close()
        f = peer.makefile("rb")
        peer.sendall(b"HELO c\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<x@test.example>\r\nDATA\r\n"
                     b"hi\r\n.\r\nQUIT\r\n")
        replies = [f.readline() for _ in range(6)]
        f.close()
    assert proc.wait(timeout=TIMEOUT) == 0
    said = replies[5]                    # a QMAILQUEUE program sees them as under tcpserver
    assert said.startswith(b"554 "), replies
    if client == "::1":
        assert said[4:].rstrip(b"\r\n").split(b"|") == [b"TCP6", b"::1", b"::1", b"::1"]
    else:
        assert said[4:].rstrip(b"\r\n").split(b"|") == [b"TCP", b"127.0.0.1", b"", b"127.0.0.1"]
