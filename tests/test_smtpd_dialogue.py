"""qmail-smtpd's dialogue: replies byte for byte (docs/submission.md "qmail-smtpd") and what lands in the queue."""
import re
import time

import pytest

from queue_view import queued
from smtpd_support import SmtpdProcess, session


@pytest.mark.slow
def test_helo_mail_rcpt_data_queues_the_message_with_qmails_replies(qmail_home):
    with session(qmail_home, TCPREMOTEHOST="client.example") as s:
        assert s.command(b"helo relay.example\r\n") == b"250 test.example\r\n"
        assert s.command(b"mail <me@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"rcpt <me@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"data\r\n") == b"354 go ahead\r\n"
        before = int(time.time())
        reply = s.command(b"Subject: hello\r\n\r\nline one\r\n..leading dot\r\n.\r\n")
        m = re.match(rb"250 ok (\d+) qp (\d+)\r\n\Z", reply)
        assert m, reply
        assert before <= int(m.group(1)) <= int(time.time())
        assert s.command(b"quit\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    [msg] = queued(qmail_home)
    assert msg.sender == b"me@test.example"
    assert msg.recipients == [b"me@test.example"]
    qp = int(m.group(2))
    assert msg.mess.startswith(b"Received: (qmail %d invoked " % qp)
    received = msg.body_after_received(1)
    assert re.match(rb"Received: from client\.example \(HELO relay\.example\) \(192\.0\.2\.7\)\n"
                    rb"  by 127\.0\.0\.1 with SMTP; \d{1,2} \w{3} \d{4} \d\d:\d\d:\d\d -0000\n",
                    received), received
    assert msg.body_after_received(2) == b"Subject: hello\n\nline one\n.leading dot\n"


@pytest.mark.slow
def test_received_line_omits_helo_equal_to_remotehost_and_shows_remoteinfo(qmail_home):
    with session(qmail_home, TCPREMOTEHOST="Client.Example", TCPREMOTEINFO="joe",
                 TCPLOCALHOST="mx.test.example") as s:
        s.command(b"HELO client.example\r\n")
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(b"x\r\n.\r\n").startswith(b"250 ok ")
    received = queued(qmail_home)[0].body_after_received(1).split(b"\n")[:2]
    assert received[0] == b"Received: from Client.Example (joe@192.0.2.7)"
    assert received[1].startswith(b"  by mx.test.example with SMTP; ")


def test_received_line_makes_unsafe_bytes_question_marks(qmail_home):
    with session(qmail_home) as s:
        s.command(b"HELO evil host(\x01)\r\n")
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        s.command(b"x\r\n.\r\n")
    line = queued(qmail_home)[0].body_after_received(1).split(b"\n")[0]
    assert line == b"Received: from unknown (HELO evil?host???) (192.0.2.7)"


def test_ehlo_advertises_pipelining_size_8bitmime(qmail_home):
    qmail_home.control("databytes", "100000\n")
    with session(qmail_home) as s:
        assert s.command(b"EHLO c.example\r\n") == (
            b"250-test.example\r\n250-PIPELINING\r\n250-SIZE 100000\r\n250-SMTPUTF8\r\n250 8BITMIME\r\n")
    qmail_home.control("databytes", "0\n")
    with session(qmail_home) as s:
        assert s.command(b"EHLO c.example\r\n") == (
            b"250-test.example\r\n250-PIPELINING\r\n250-SIZE\r\n250-SMTPUTF8\r\n250 8BITMIME\r\n")


@pytest.mark.slow
def test_size_parameter_over_databytes_is_refused_at_mail(qmail_home):
    qmail_home.control("databytes", "1000")
    with session(qmail_home) as s:
        assert s.command(b"MAIL FROM:<a@b.example> SIZE=1001\r\n") == (
            b"552 sorry, that message size exceeds my databytes limit (#5.3.4)\r\n")
        assert s.command(b"RCPT TO:<x@test.example>\r\n") == b"503 MAIL first (#5.5.1)\r\n"
        assert s.command(b"MAIL FROM:<a@b.example> BODY=8BITMIME SIZE=1000\r\n") == b"250 ok\r\n"


@pytest.mark.slow
def test_refused_size_ends_the_open_transaction_of_a_pipelining_client(qmail_home):
    qmail_home.control("databytes", "1000")
    with session(qmail_home) as s:
        s.send(b"MAIL FROM:<a@b.example>\r\nRCPT TO:<one@test.example>\r\n"
               b"MAIL FROM:<b@b.example> SIZE=5000\r\nRCPT TO:<two@test.example>\r\nDATA\r\n")
        assert [s.reply() for _ in range(5)] == [b"250 ok\r\n", b"250 ok\r\n",
                                b"552 sorry, that message size exceeds my databytes limit (#5.3.4)\r\n",
                                b"503 MAIL first (#5.5.1)\r\n", b"503 MAIL first (#5.5.1)\r\n"]
        assert s.command(b"QUIT\r\n").startswith(b"221 ")
    assert queued(qmail_home) == []


@pytest.mark.slow
@pytest.mark.parametrize("line, reply", [
    (b"RSET\r\n", b"250 flushed\r\n"),
    (b"NOOP\r\n", b"250 ok\r\n"),
    (b"noop with arguments\r\n", b"250 ok\r\n"),
    (b"VRFY root\r\n", b"252 send some mail, i'll try my best\r\n"),
    (b"HELP\r\n", b"214 qmail home page: http://pobox.com/~djb/qmail.html\r\n"),
    (b"EXPN list\r\n", b"502 unimplemented (#5.5.1)\r\n"),
    (b"STARTTLS\r\n", b"502 unimplemented (#5.5.1)\r\n"),
    (b"\r\n", b"502 unimplemented (#5.5.1)\r\n"),
    (b"RCPT TO:<x@test.example>\r\n", b"503 MAIL first (#5.5.1)\r\n"),
    (b"DATA\r\n", b"503 MAIL first (#5.5.1)\r\n"),
    (b"MAIL FROM:<" + b"a" * 890 + b"@b.example>\r\n", b"555 syntax error (#5.5.4)\r\n"),
])
def test_single_command_replies(qmail_home, line, reply):
    with session(qmail_home) as s:
        assert s.command(line) == reply


@pytest.mark.slow
def test_data_without_rcpt_and_mail_needed_again_after_data(qmail_home):
    with session(qmail_home) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"DATA\r\n") == b"503 RCPT first (#5.5.1)\r\n"
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        s.command(b"one\r\n.\r\n")
        assert s.command(b"RCPT TO:<y@test.example>\r\n") == b"503 MAIL first (#5.5.1)\r\n"
        assert s.command(b"DATA\r\n") == b"503 MAIL first (#5.5.1)\r\n"


@pytest.mark.slow
def test_relaying_refused_outside_rcpthosts_and_allowed_with_relayclient(qmail_home):
    with session(qmail_home) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"RCPT TO:<victim@elsewhere.example>\r\n") == (
            b"553 sorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)\r\n")
        assert s.command(b"RCPT TO:<Postmaster@TEST.EXAMPLE>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<postmaster>\r\n") == b"250 ok\r\n"
    with session(qmail_home, RELAYCLIENT="") as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"RCPT TO:<friend@elsewhere.example>\r\n") == b"250 ok\r\n"
        s.command(b"DATA\r\n")
        assert s.command(b"hi\r\n.\r\n").startswith(b"250 ok ")
    assert queued(qmail_home)[0].recipients == [b"friend@elsewhere.example"]


@pytest.mark.slow
def test_relayclient_value_is_appended_to_recipients(qmail_home):
    with session(qmail_home, RELAYCLIENT=".relay") as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@y.example>\r\n")
        s.command(b"DATA\r\n")
        s.command(b"hi\r\n.\r\n")
    assert queued(qmail_home)[0].recipients == [b"x@y.example.relay"]


def test_rcpthosts_suffix_entries_and_morercpthosts_cdb(qmail_home):
    from qmailpy.util.cdb import build
    import os
    qmail_home.control("rcpthosts", "test.example\n.sub.example\n")
    build(os.path.join(qmail_home.path, "control", "morercpthosts.cdb"),
          [(b"more.example", b""), (b".wild.example", b"")])
    with session(qmail_home) as s:
        s.command(b"MAIL FROM:<>\r\n")
        for rcpt, ok in [(b"a@x.sub.example", True), (b"a@sub.example", False),
                         (b"a@MORE.example", True), (b"a@x.more.example", False),
                         (b"a@deep.x.wild.example", True), (b"a@other.example", False)]:
            reply = s.command(b"RCPT TO:<" + rcpt + b">\r\n")
            assert (reply == b"250 ok\r\n") is ok, (rcpt, reply)


def test_rcpthosts_absent_accepts_everything(qmail_home):
    import os
    os.unlink(os.path.join(qmail_home.path, "control", "rcpthosts"))
    with session(qmail_home) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"RCPT TO:<x@anywhere.example>\r\n") == b"250 ok\r\n"


def test_badmailfrom_address_and_domain_refused_at_each_rcpt(qmail_home):
    qmail_home.control("badmailfrom", "spammer@evil.example\n@worse.example\n")
    with session(qmail_home) as s:
        for sender in (b"SPAMMER@evil.example", b"anyone@Worse.Example"):
            assert s.command(b"MAIL FROM:<" + sender + b">\r\n") == b"250 ok\r\n"
            assert s.command(b"RCPT TO:<x@test.example>\r\n") == (
                b"553 sorry, your envelope sender is in my badmailfrom list (#5.7.1)\r\n")
        s.command(b"MAIL FROM:<fine@evil.example>\r\n")
        assert s.command(b"RCPT TO:<x@test.example>\r\n") == b"250 ok\r\n"


def test_localiphost_rewrites_bracketed_local_ip(qmail_home):
    qmail_home.control("localiphost", "test.example")
    with session(qmail_home) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        assert s.command(b"RCPT TO:<joe@[127.0.0.1]>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<joe@[192.0.2.250]>\r\n").startswith(b"553 ")
        s.command(b"DATA\r\n")
        s.command(b"x\r\n.\r\n")
    assert queued(qmail_home)[0].recipients == [b"joe@test.example"]


@pytest.mark.slow
def test_smtpgreeting_and_missing_me(qmail_home):
    qmail_home.control("smtpgreeting", "mx.example welcomes you")
    with SmtpdProcess(qmail_home) as s:
        assert s.reply() == b"220 mx.example welcomes you ESMTP\r\n"
        assert s.command(b"HELO x\r\n") == b"250 mx.example welcomes you\r\n"
        assert s.command(b"QUIT\r\n") == b"221 mx.example welcomes you\r\n"
    import os
    os.unlink(os.path.join(qmail_home.path, "control", "smtpgreeting"))
    os.unlink(os.path.join(qmail_home.path, "control", "me"))
    with SmtpdProcess(qmail_home) as s:
        assert s.rest() == b"421 unable to read controls (#4.3.0)\r\n"
        assert s.close() == 1


@pytest.mark.slow
@pytest.mark.parametrize("arg, addr", [
    (b"FROM:<a@b.example>", b"a@b.example"),
    (b"FROM: <a@b.example> BODY=8BITMIME", b"a@b.example"),
    (b"from:a@b.example", b"a@b.example"),
    (b"FROM:   a@b.example SIZE=10", b"a@b.example"),
    (b"FROM:<@relay.example,@r2.example:a@b.example>", b"a@b.example"),
    (b'FROM:<"john smith"@b.example>', b"john smith@b.example"),
    (b'FROM:<"a>b"@b.example>', b"a>b@b.example"),
    (b"FROM:<a\\>b@b.example>", b"a>b@b.example"),
    (b"FROM:<>", b""),
])
def test_mail_address_parsing(qmail_home, arg, addr):
    with session(qmail_home) as s:
        assert s.command(b"MAIL " + arg + b"\r\n") == b"250 ok\r\n"
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(b"x\r\n.\r\n").startswith(b"250 ok")
    assert queued(qmail_home)[0].sender == addr


@pytest.mark.slow
def test_too_many_hops_refused_and_nothing_queued(qmail_home):
    header = b"".join(b"Received: hop %d\r\n" % i for i in range(50))
    header += b"".join(b"DELIVERED-to: hop %d\r\n" % i for i in range(50))
    with session(qmail_home) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(header + b"\r\nbody\r\n.\r\n") == (
            b"554 too many hops, this message is looping (#5.4.6)\r\n")
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        # 99 hops pass; Received lines after the header's end do not count
        assert s.command(header[19:] + b"\r\n" + header + b".\r\n").startswith(b"250 ok")
    assert len(queued(qmail_home)) == 1


@pytest.mark.slow
def test_queue_failure_text_is_relayed(qmail_home):
    import pathlib
    script = pathlib.Path(qmail_home.path) / "reject"      # reachable after the drop to qmaild
    script.write_text("#!/bin/sh\ncat >/dev/null\nexit 31\n")
    script.chmod(0o755)
    with session(qmail_home, QMAILQUEUE=str(script)) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(b"x\r\n.\r\n") == (
            b"554 mail server permanently rejected message (#5.3.0)\r\n")
    script.write_text("#!/bin/sh\ncat >/dev/null\nexit 71\n")
    with session(qmail_home, QMAILQUEUE=str(script)) as s:
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(b"x\r\n.\r\n") == (
            b"451 mail server temporarily rejected message (#4.3.0)\r\n")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["ipv4", "dual-stack"])
def test_systemd_socket_activation_environment_is_mapped_to_tcpserver_names(qmail_home, family):
    import socket
    import subprocess
    from smtpd_support import TIMEOUT
    if family == "ipv4":
        server = socket.create_server(("127.0.0.1", 0))
    else:                               # what ListenStream=25 makes: IPv4 clients arrive as ::ffff:a.b.c.d
        if not socket.has_dualstack_ipv6():
            pytest.skip("no dual-stack IPv6 here")
        try:
            server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError as e:
            pytest.skip("no IPv6 socket: %s" % e)
    client = socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=TIMEOUT)
    conn, peer = server.accept()
    server.close()
    env = {k: v for k, v in qmail_home.env.items()
           if not k.startswith("TCP") and k not in ("PROTO", "RELAYCLIENT", "DATABYTES")}
    env.update(REMOTE_ADDR=peer[0], REMOTE_PORT=str(peer[1]))     # what Accept=yes sets
    proc = subprocess.Popen(["qmail-smtpd"], stdin=conn, stdout=conn, env=env)
    conn.close()
    try:
        f = client.makefile("rb")
        assert f.readline() == b"220 test.example ESMTP\r\n"
        client.sendall(b"HELO c\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<x@test.example>\r\nDATA\r\n"
                       b"x\r\n.\r\nQUIT\r\n")
        replies = [f.readline() for _ in range(6)]
        assert replies[4].startswith(b"250 ok ") and replies[5] == b"221 test.example\r\n"
        f.close()
    finally:
        client.close()
        assert proc.wait(timeout=TIMEOUT) == 0
    line = queued(qmail_home)[0].body_after_received(1).split(b"\n")[0]
    assert line == b"Received: from unknown (HELO c) (127.0.0.1)"
