"""Milters in qmail-smtpd (docs/milter.md): the real qmail-smtpd on a socket pair talks
to tests/milter_peer.py's milter over a real socket; each action a milter uses, the
macros at each stage, and the milters that hang, answer garbage or hang up.
"""
import json
import os
import re
import smtplib
import struct

import pytest

from delivery_support import maildir_messages, wait_maildir
from lspawn_harness import LocalUsers
from milter_peer import CLOSE, HANG, MilterPeer
from queue_commands_support import ctl
from queue_view import queued
from send_harness import Daemons
from smtpd_support import GREETING, TIMEOUT, ListenerProcess, SmtpdProcess
from smtpd_tls_support import certs, tls_home  # noqa: F401  (fixtures: a TLS home with checkpassword)

pytestmark = pytest.mark.slow

MESSAGE = (b"From: a@b.example\r\nSubject: hi\r\nX-Tag: one\r\nX-Tag: two\r\n\r\n"
           b"line 1\r\nline 2\r\n.\r\n")


def dialogue(home, rcpts=(b"x@test.example",), message=MESSAGE, **env):
    """One transaction; (replies of MAIL, each RCPT, DATA, the end of data), stderr."""
    with SmtpdProcess(home, **env) as s:
        assert s.reply() == GREETING
        replies = [s.command(b"EHLO client.example\r\n")[:4]]
        replies.append(s.command(b"MAIL FROM:<a@b.example>\r\n"))
        for rcpt in rcpts:
            replies.append(s.command(b"RCPT TO:<%s>\r\n" % rcpt))
        data = s.command(b"DATA\r\n")
        replies.append(data)
        if data.startswith(b"354"):
            replies.append(s.command(message))
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    return replies[1:], s.stderr


def only(home):
    [m] = queued(home)
    return m


@pytest.fixture
def milter(qmail_home):
    peers = []

    def start(*settings, **kw):
        peer = MilterPeer(**kw)
        peers.append(peer)
        lines = "".join(p.control_line(*settings) for p in peers)
        qmail_home.control("milters", lines)
        return peer
    yield start
    for peer in peers:
        peer.close()


def test_continue_queues_unchanged_with_postfix_macros(qmail_home, milter):
    peer = milter()
    replies, _ = dialogue(qmail_home)
    assert replies[:3] == [b"250 ok\r\n", b"250 ok\r\n", b"354 go ahead\r\n"]
    assert replies[3].startswith(b"250 ok ")
    m = only(qmail_home)
    assert (m.sender, m.recipients) == (b"a@b.example", [b"x@test.example"])
    assert m.body_after_received() == MESSAGE[:-3].replace(b"\r\n", b"\n")
    assert peer.commands()[:1] == [b"O"]
    steps = [c for c in peer.commands() if c not in (b"D", b"B", b"L")]
    assert steps == [b"O", b"C", b"H", b"M", b"R", b"T", b"N", b"E", b"Q"]
    assert peer.data_of(b"C") == [b"[192.0.2.7]\x004" + struct.pack(">H", 4000) + b"192.0.2.7\0"]
    assert peer.data_of(b"H") == [b"client.example\0"]
    assert peer.data_of(b"M") == [b"<a@b.example>\0"]
    assert peer.data_of(b"R") == [b"<x@test.example>\0"]
    connect = peer.macros(b"C")
    assert connect[b"j"] == b"test.example" and connect[b"{daemon_name}"] == b"qmail-smtpd"
    assert connect[b"{client_addr}"] == b"192.0.2.7"
    mail = peer.macros(b"M")
    assert mail[b"{mail_addr}"] == b"a@b.example" and mail[b"i"]
    assert peer.macros(b"R")[b"{rcpt_addr}"] == b"x@test.example"
    assert peer.macros(b"E")[b"i"] == mail[b"i"]
    headers = [h.split(b"\0")[:2] for h in peer.data_of(b"L")]
    assert headers[0][0] == b"Received"
    assert headers[1:] == [[b"From", b"a@b.example"], [b"Subject", b"hi"], [b"X-Tag", b"one"],
                           [b"X-Tag", b"two"]]
    assert peer.data_of(b"B") == [b"line 1\r\nline 2\r\n"]


@pytest.mark.parametrize("code, reply", [
    (b"r", b"550 sorry, a mail filter refuses this (#5.7.1)\r\n"),
    (b"t", b"451 a mail filter asks to try again later (#4.7.1)\r\n")])
def test_reject_and_tempfail_at_each_step(qmail_home, milter, code, reply):
    peer = milter(respond=lambda c, d: [(code, b"")] if c == b"M" else None)
    replies, _ = dialogue(qmail_home)
    assert replies[0] == reply and replies[-1] == b"503 MAIL first (#5.5.1)\r\n"
    peer.respond = lambda c, d: [(code, b"")] if d == b"<y@test.example>\0" else None
    replies, _ = dialogue(qmail_home, rcpts=(b"x@test.example", b"y@test.example"))
    assert replies[1:3] == [b"250 ok\r\n", reply] and replies[4].startswith(b"250 ok ")
    assert only(qmail_home).recipients == [b"x@test.example"]
    peer.respond = lambda c, d: [(code, b"")] if c == b"E" else None
    replies, _ = dialogue(qmail_home)
    assert replies[-1] == reply
    assert len(queued(qmail_home)) == 1


def test_replycode_accept_and_discard(qmail_home, milter):
    peer = milter(respond=lambda c, d: [(b"y", b"554 5.7.1 spam detected\0")] if c == b"E" else None)
    replies, _ = dialogue(qmail_home)
    assert replies[-1] == b"554 5.7.1 spam detected\r\n"
    peer.respond = lambda c, d: [(b"y", b"421-4.7.0 one\r\n421 4.7.0 two\0")] if c == b"R" else None
    replies, _ = dialogue(qmail_home)
    assert replies[1] == b"421-4.7.0 one\r\n421 4.7.0 two\r\n"
    peer.respond = lambda c, d: [(b"d", b"")] if c == b"E" else None
    replies, stderr = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ") and queued(qmail_home) == []
    assert b"milter: discarded message " in stderr
    received = len(peer.received)
    peer.respond = lambda c, d: [(b"a", b"")] if c == b"M" else None
    replies, _ = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ") and len(queued(qmail_home)) == 1
    after_accept = [c for c, _ in peer.received[received:]]
    assert b"R" not in after_accept and b"E" not in after_accept      # done with this message


def test_header_edits(qmail_home, milter):
    def respond(c, d):
        if c == b"E":
            return [(b"h", b"X-Spam\0yes\0"),
                    (b"i", struct.pack(">I", 0) + b"X-First\0top\0"),
                    (b"m", struct.pack(">I", 2) + b"X-Tag\0changed\0"),
                    (b"m", struct.pack(">I", 1) + b"Subject\0\0"),
                    (b"a", b"")]
    milter(respond=respond)
    replies, _ = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ")
    mess = only(qmail_home).mess
    head = mess.split(b"\n\n")[0].split(b"\n")
    assert head[0].startswith(b"Received: ")            # qmail-queue's own line comes first
    assert head[1] == b"X-First: top" and head[2].startswith(b"Received: from")
    assert b"Subject" not in mess
    assert head[-4:] == [b"From: a@b.example", b"X-Tag: one", b"X-Tag: changed", b"X-Spam: yes"]
    assert mess.endswith(b"\n\nline 1\nline 2\n")


def test_envelope_edits(qmail_home, milter):
    def respond(c, d):
        if c == b"E":
            return [(b"+", b"<new@test.example>\0"), (b"2", b"<par@test.example>\0NOTIFY=NEVER\0"),
                    (b"-", b"<X@test.example>\0"), (b"e", b"<bounce@b.example>\0"), (b"c", b"")]
    milter(respond=respond)
    replies, _ = dialogue(qmail_home, rcpts=(b"x@test.example", b"keep@test.example"))
    assert replies[-1].startswith(b"250 ok ")
    m = only(qmail_home)
    assert m.sender == b"bounce@b.example"
    assert m.recipients == [b"keep@test.example", b"new@test.example", b"par@test.example"]


def test_every_recipient_removed_is_554(qmail_home, milter):
    milter(respond=lambda c, d: [(b"-", b"<x@test.example>\0"), (b"c", b"")] if c == b"E" else None)
    replies, _ = dialogue(qmail_home)
    assert replies[-1] == b"554 a mail filter removed every recipient (#5.7.1)\r\n"
    assert queued(qmail_home) == []


def test_big_body_in_chunks_replaced_by_a_big_body(qmail_home, milter):
    body = b"".join(b"%07d ........................................\r\n" % i for i in range(4000))
    new = b"".join(b"new %07d ++++++++++++++++++++++++++++++++++++\r\n" % i for i in range(3000))

    def respond(c, d):
        if c == b"E":
            chunks = [new[i:i + 65535] for i in range(0, len(new), 65535)]
            return [(b"b", chunk) for chunk in chunks] + [(b"c", b"")]
    peer = milter(respond=respond)
    replies, _ = dialogue(qmail_home, message=b"Subject: big\r\n\r\n" + body + b".\r\n")
    assert replies[-1].startswith(b"250 ok ")
    sent = peer.data_of(b"B")
    assert len(sent) > 2 and all(len(chunk) <= 65535 for chunk in sent)
    assert b"".join(sent) == body
    assert only(qmail_home).mess.endswith(b"Subject: big\n\n" + new.replace(b"\r\n", b"\n"))


def test_skip_and_no_reply_steps(qmail_home, milter):
    body = b"x" * 70 + b"\r\n"
    # NOHELO, NR_HDR, NR_MAIL, SKIP: no HELO, no reply to MAIL or headers, skip after one chunk
    peer = milter(steps=0x2 | 0x80 | 0x4000 | 0x400,
                  respond=lambda c, d: [(b"s", b"")] if c == b"B" else None)
    replies, _ = dialogue(qmail_home, message=b"Subject: s\r\n\r\n" + body * 2000 + b".\r\n")
    assert replies[-1].startswith(b"250 ok ")
    assert b"H" not in peer.commands() and len(peer.data_of(b"B")) == 1
    assert only(qmail_home).mess.endswith(body.replace(b"\r\n", b"\n") * 2000)


def QUARANTINE(command, data):
    return [(b"q", b"looks bad\0"), (b"c", b"")] if command == b"E" else None


@pytest.mark.both_backends
def test_quarantine_queues_the_message_on_hold_until_released(qmail_home, milter):
    """A quarantine is a 250: the message is queued held (qmail-send logs `hold msg N` as it
    preprocesses it and starts no delivery of it) and `qmailctl queue release` delivers it."""
    joe = LocalUsers(qmail_home).add("joe")
    peer = milter(respond=QUARANTINE)
    replies, stderr = dialogue(qmail_home, rcpts=(b"joe@test.example",))
    assert struct.unpack(">I", peer.data_of(b"O")[0][4:8])[0] & 0x20    # SMFIF_QUARANTINE offered
    assert replies[-1].startswith(b"250 ok "), replies
    assert re.search(rb"milter: \S+ asks to quarantine message \S+: looks bad\n", stderr), stderr
    assert re.search(rb"milter: message \S+ queued on hold: ok \d+ qp \d+\n", stderr)
    held = only(qmail_home).n
    free = qmail_home.queue_message(b"Subject: free\n\nfree\n", b"a@b.example", [b"joe@test.example"])
    assert free.returncode == 0
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_line(r"^hold msg %d$" % held)
        daemons.wait_line(r"^end msg ")              # the other message went through meanwhile
        assert not [l for l in daemons.lines() if re.match(r"starting delivery \d+: msg %d " % held, l)]
        [got] = maildir_messages(os.path.join(joe, "Maildir"))
        assert b"Subject: free\n" in got
        listing = qmail_home.run(["qmailctl", "queue", "list", "--home", qmail_home.path, "--json",
                                  str(held)])
        assert listing.returncode == 0, listing.stderr
        record = json.loads(listing.stdout)
        assert (record["state"], record["held"]) == ("HELD", True)
        released = ctl(qmail_home, "release", str(held))
        assert (released.returncode, released.stdout) == (0, b"%d: released\n" % held)
        got = wait_maildir(os.path.join(joe, "Maildir"), 2)
        assert any(b"Subject: hi\n" in m for m in got)
        daemons.wait_line(r"^end msg %d$" % held)
    finally:
        daemons.kill()


def test_quarantine_through_a_qmailqueue_program_is_a_451(qmail_home, milter):
    """A $QMAILQUEUE program may not read $QMAILHOLD: the message is not queued unheld."""
    milter(respond=QUARANTINE)
    replies, stderr = dialogue(qmail_home, QMAILQUEUE=os.path.join(qmail_home.path, "bin", "qmail-queue"))
    assert replies[-1] == b"451 a mail filter asks for a quarantine, which this queue cannot hold (#4.7.1)\r\n"
    assert queued(qmail_home) == [] and b"asks to quarantine" in stderr


def test_connect_reject_refuses_every_command_but_quit(qmail_home, milter):
    milter(respond=lambda c, d: [(b"r", b"")] if c == b"C" else None)
    with SmtpdProcess(qmail_home) as s:
        assert s.reply() == GREETING
        for command in (b"EHLO c\r\n", b"MAIL FROM:<a@b.example>\r\n", b"NOOP\r\n"):
            assert s.command(command) == b"550 sorry, a mail filter refuses this (#5.7.1)\r\n"
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"


def test_unix_socket_and_two_milters_in_order(qmail_home, milter):
    # (in the home: qmail-smtpd may run as another account, which cannot enter tmp_path)
    first = milter(unix=os.path.join(qmail_home.path, "m1.sock"),
                   respond=lambda c, d: [(b"h", b"X-One\0" + b"1\0"), (b"c", b"")] if c == b"E" else None)
    second = milter(respond=lambda c, d: [(b"h", b"X-Two\0" + b"2\0"), (b"c", b"")] if c == b"E" else None)
    replies, _ = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ")
    assert b"X-One: 1\nX-Two: 2\n\n" in only(qmail_home).mess
    assert first.connections == second.connections == 1


def test_bad_control_line_is_421(qmail_home):
    qmail_home.control("milters", "inet:127.0.0.1:1 default=maybe\n")
    with SmtpdProcess(qmail_home) as s:
        assert s.rest() == b"421 unable to read controls (#4.3.0)\r\n"


UNAVAILABLE = b"451 mail filter unavailable, try again later (#4.7.1)\r\n"


@pytest.mark.parametrize("behaviour", [HANG, CLOSE, b"\0\0\0\x02zz garbage"])
def test_broken_milter_mid_message_gets_its_default(qmail_home, milter, behaviour):
    peer = milter("data=1", respond=lambda c, d: behaviour if c == b"B" else None)
    replies, stderr = dialogue(qmail_home)
    assert replies[-1] == UNAVAILABLE and queued(qmail_home) == []
    assert b"default tempfail" in stderr
    peer.respond = lambda c, d: behaviour if c == b"M" else None
    qmail_home.control("milters", peer.control_line("command=1", "default=accept"))
    replies, stderr = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ") and len(queued(qmail_home)) == 1
    assert b"default accept" in stderr


def test_milter_down_tempfails_every_transaction(qmail_home):
    qmail_home.control("milters", "unix:/nonexistent/milter.sock\n")
    replies, stderr = dialogue(qmail_home)
    assert replies[0] == UNAVAILABLE
    assert b"milter: cannot connect to unix:/nonexistent/milter.sock" in stderr
    qmail_home.control("milters", "unix:/nonexistent/milter.sock default=accept\n")
    replies, _ = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ")


def test_session_worker_keeps_serving_after_broken_milters(qmail_home, milter):
    behaviours = iter([HANG, CLOSE, b"\xff\xff\xff\xffgarbage", None])
    current = [None]

    def respond(c, d):
        if c == b"M":
            current[0] = next(behaviours)
        return current[0] if c == b"B" else None
    peer = milter("data=1", unix=os.path.join(qmail_home.path, "m.sock"), respond=respond)
    with ListenerProcess(qmail_home, "-c", "1") as listener:
        for attempt in range(4):
            with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
                client.ehlo("client.example")
                client.mail("a@b.example")
                client.rcpt("x@test.example")
                code, text = client.data(b"Subject: %d\r\n\r\nbody\r\n" % attempt)
                if attempt < 3:
                    assert (code, text) == (451, b"mail filter unavailable, try again later (#4.7.1)")
                    assert queued(qmail_home) == []
                else:
                    assert code == 250
        assert listener.stop() == 0
    [m] = queued(qmail_home)
    assert m.mess.endswith(b"Subject: 3\n\nbody\n")
    assert len(peer.pids) == 4 and len(set(peer.pids)) == 1        # one worker served them all


def test_spool_failure_is_451_and_nothing_queued(qmail_home, milter):
    milter()
    big = b"Subject: big\r\n\r\n" + (b"y" * 1000 + b"\r\n") * 1200 + b".\r\n"
    replies, stderr = dialogue(qmail_home, message=big, TMPDIR="/nonexistent-qmailpy-spool")
    assert replies[-1] == b"451 qq write error or disk full (#4.3.0)\r\n"
    assert queued(qmail_home) == [] and b"unable to spool the message" in stderr


def test_macro_lists_leading_space_and_helo_refusal(qmail_home, milter):
    # SETSYMLIST: only {client_addr} at connect, only {rcpt_host} at RCPT (none of the defaults)
    lists = struct.pack(">I", 0) + b"{client_addr}\0" + struct.pack(">I", 3) + b"{rcpt_host}\0"
    peer = milter(steps=0x100000, symlists=lists,
                  respond=lambda c, d: [(b"h", b"X-Lead\0  two spaces\0"), (b"c", b"")]
                  if c == b"E" else None)
    replies, _ = dialogue(qmail_home)
    assert replies[-1].startswith(b"250 ok ")
    assert peer.macros(b"C") == {b"{client_addr}": b"192.0.2.7"}
    assert peer.macros(b"R") == {b"{rcpt_host}": b"test.example"}
    assert peer.macros(b"M") == {b"i": peer.macros(b"E")[b"i"], b"{mail_addr}": b"a@b.example",
                                 b"{mail_host}": b"b.example", b"{mail_mailer}": b"smtp"}
    assert [h.split(b"\0")[:2] for h in peer.data_of(b"L")][1] == [b"From", b" a@b.example"]
    assert b"\nX-Lead:  two spaces\n\n" in only(qmail_home).mess
    peer.respond = lambda c, d: [(b"y", b"550 5.7.1 go away\0")] if c == b"H" else None
    with SmtpdProcess(qmail_home) as s:
        assert s.reply() == GREETING
        assert s.command(b"HELO bad.example\r\n") == b"550 5.7.1 go away\r\n"
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"


def test_tls_and_auth_macros(tls_home, certs):
    from smtpd_tls_support import tls_session
    with MilterPeer() as peer:
        tls_home.control("milters", peer.control_line())
        with tls_session(tls_home, certs, SMTPAUTH="") as s:
            assert s.command(b"EHLO c.example\r\n").startswith(b"250-")
            assert s.command(b"AUTH PLAIN AGFsaWNlAHMzY3JldA==\r\n").startswith(b"235 ")
            assert s.command(b"MAIL FROM:<alice@test.example>\r\n") == b"250 ok\r\n"
            s.command(b"QUIT\r\n")
            assert s.close() == 0
        helo = peer.macros(b"H")
        assert helo[b"{tls_version}"] in (b"TLSv1.2", b"TLSv1.3") and helo[b"{cipher}"]
        assert peer.macros(b"M")[b"{auth_authen}"] == b"alice"
        assert peer.data_of(b"H") == [b"c.example\0", b"c.example\0"]
