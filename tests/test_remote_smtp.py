"""qmail-remote as a program against SMTP peers on 127.0.0.1 (docs/delivery.md "qmail-remote"; docs/delivery.md "SMTP dialogue").

Routing is by control/smtproutes `domain:[127.0.0.1]:PORT`; the peers are a
real aiosmtpd server and scripted raw servers for exact bytes and misbehaviour.
"""
import os

import pytest
from hypothesis import given, settings, strategies as st

from remote_harness import (ScriptedPeer, Smtpd, closed_port, no_bare_line_ends, qmail_remote,
                            route)

pytestmark = pytest.mark.slow

MESSAGE = (b"Subject: dots and line ends\n\n.leading dot\n..two dots\nLF line\nCRLF line\r\n"
           b"bare\rCR\n8-bit \xe9\xff\n.\nlast\n")
WIRE_BODY = (b"Subject: dots and line ends\r\n\r\n..leading dot\r\n...two dots\r\nLF line\r\n"
             b"CRLF line\r\nbare\r\nCR\r\n8-bit \xe9\xff\r\n..\r\nlast\r\n")


def test_accepted_message_envelope_and_bytes(qmail_home):
    qmail_home.control("helohost", "helo.example\n")
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        code, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test", message=MESSAGE)
    assert code == 0
    assert records == [b"r", b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"]
    [t] = peer.transactions
    assert (t.helo, t.mail_from, t.rcpt_tos) == ("helo.example", "a@b.example", ["joe@x.test"])
    # aiosmtpd hands over the data after undoing the dot-stuffing
    assert t.data == WIRE_BODY.replace(b"\r\n..", b"\r\n.")


def test_exact_wire_bytes(qmail_home):
    script = [("send", b"220 peer ESMTP\r\n"), ("line",), ("send", b"250 peer\r\n"),
              ("line",), ("send", b"250 ok\r\n"), ("line",), ("send", b"250 ok\r\n"),
              ("line",), ("send", b"354 go ahead\r\n"), ("data",), ("send", b"250 ok 12345\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test", message=MESSAGE)
        assert peer.done.wait(30)
    assert records[-1] == b"K127.0.0.1 accepted message.\nRemote host said: 250 ok 12345\n"
    assert peer.received[0] == (b"EHLO test.example\r\nMAIL FROM:<a@b.example>\r\n"
                                b"RCPT TO:<joe@x.test>\r\nDATA\r\n" + WIRE_BODY + b".\r\nQUIT\r\n")
    assert no_bare_line_ends(peer.received[0])


@pytest.mark.parametrize("body", [
    b"a\rb\n", b"a\r\rb\n", b"a\r.\r\nQUIT\n", b"x\n\r.\r\n", b"a\r\n.\r\r\n", b"\r.\n", b"ends with CR\r",
    b"\n\n\r\r\n\n", b".\r\n.\n.\r",
])
def test_bare_cr_and_lf_never_leave(qmail_home, body):
    """SMTP smuggling (docs/submission.md "qmail-smtpd"): only CRLF goes out, and no body line is a lone '.'."""
    script = [("send", b"220 p\r\n"), ("line",), ("send", b"250 p\r\n"), ("line",), ("send", b"250 ok\r\n"),
              ("line",), ("send", b"250 ok\r\n"), ("line",), ("send", b"354 go\r\n"), ("data",),
              ("send", b"250 ok\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test", message=body)
        assert peer.done.wait(30)
    assert records[-1].startswith(b"K127.0.0.1 accepted message.")
    wire = peer.received[0]
    assert no_bare_line_ends(wire)
    data = wire[wire.index(b"DATA\r\n") + 6:]
    assert data.index(b"\r\n.\r\n") + 5 == len(data) - len(b"QUIT\r\n") or data.startswith(b".\r\n")
    assert data.endswith(b".\r\nQUIT\r\n")


def test_sample_log_wording_for_temporary_recipient_failure(qmail_home):
    with Smtpd() as peer:
        peer.rcpt_replies["joe@x.test"] = "451 4.3.0 responder: try again later"
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [
        b"s127.0.0.1 does not like recipient.\nRemote host said: 451 4.3.0 responder: try again later\n",
        b"DGiving up on 127.0.0.1.\n"]
    assert peer.transactions == []


def test_permanent_recipient_failure(qmail_home):
    with Smtpd() as peer:
        peer.rcpt_replies["joe@x.test"] = "550 5.1.1 responder: no such user here"
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test", b"ann@x.test")
    assert records == [
        b"h127.0.0.1 does not like recipient.\nRemote host said: 550 5.1.1 responder: no such user here\n",
        b"r", b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"]
    assert peer.transactions[0].rcpt_tos == ["ann@x.test"]


@pytest.mark.parametrize("reply,letter", [("451 4.3.0 later", b"Z"), ("554 5.7.1 no", b"D")])
def test_failure_after_the_final_dot(qmail_home, reply, letter):
    with Smtpd() as peer:
        peer.data_reply = reply
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"r", letter + b"127.0.0.1 failed after I sent the message.\nRemote host said: "
                       + reply.encode() + b"\n"]


@pytest.mark.parametrize("reply,letter", [("451 4.3.0 busy", b"Z"), ("553 5.7.1 go away", b"D")])
def test_sender_rejected(qmail_home, reply, letter):
    with Smtpd() as peer:
        peer.mail_reply = reply
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [letter + b"Connected to 127.0.0.1 but sender was rejected.\nRemote host said: "
                       + reply.encode() + b"\n"]


def _until_data(data_reply):
    return [("send", b"220 p\r\n"), ("line",), ("send", b"250 p\r\n"), ("line",), ("send", b"250 ok\r\n"),
            ("line",), ("send", b"250 ok\r\n"), ("line",), ("send", data_reply)]


@pytest.mark.parametrize("reply,letter", [(b"451 not now\r\n", b"Z"), (b"554 never\r\n", b"D")])
def test_data_command_refused(qmail_home, reply, letter):
    with ScriptedPeer(_until_data(reply)) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"r", letter + b"127.0.0.1 failed on DATA command.\nRemote host said: "
                       + reply.replace(b"\r", b"")]
    assert peer.received[0].endswith(b"DATA\r\nQUIT\r\n")


def test_greeting_failed_and_multiline_reply(qmail_home):
    script = [("send", b"554-first line\r\n554-second\x00line\r\n554 last line\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"ZConnected to 127.0.0.1 but greeting failed.\nRemote host said: "
                       b"554-first line\n554-second?line\n554 last line\n"]
    assert peer.received[0] == b"QUIT\r\n"


def test_multiline_greeting_accepted_and_helo_rejected(qmail_home):
    script = [("send", b"220-hello\r\n220-there\r\n220 ready\r\n"), ("line",),
              ("send", b"501-bad\r\n501 name\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"ZConnected to 127.0.0.1 but my name was rejected.\nRemote host said: "
                       b"501-bad\n501 name\n"]


def test_connection_refused(qmail_home):
    route(qmail_home, "x.test", closed_port())
    _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n"]


def test_peer_that_hangs_times_out(qmail_home):
    qmail_home.control("timeoutremote", "1\n")
    with ScriptedPeer([("send", b"220 p\r\n"), ("hang",)]) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"ZConnected to 127.0.0.1 but connection died. (#4.4.2)\n"]
    assert peer.received[0] == b"EHLO test.example\r\n"


def test_peer_drops_before_data_reply(qmail_home):
    script = _until_data(b"")[:-1] + [("close",)]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"r", b"ZConnected to 127.0.0.1 but connection died. (#4.4.2)\n"]


def test_peer_drops_after_the_final_dot_possible_duplicate(qmail_home):
    script = _until_data(b"354 go\r\n") + [("data",), ("close",)]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"r", b"ZConnected to 127.0.0.1 but connection died. Possible duplicate! (#4.4.2)\n"]


def test_peer_hangs_after_the_final_dot_possible_duplicate(qmail_home):
    qmail_home.control("timeoutremote", "1\n")
    script = _until_data(b"354 go\r\n") + [("data",), ("hang",)]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"r", b"ZConnected to 127.0.0.1 but connection died. Possible duplicate! (#4.4.2)\n"]
    assert peer.received[0].endswith(b"\r\n.\r\n")


def test_peer_drops_mid_data_plain_deferral(qmail_home):
    """The peer reads half the body and closes: it never saw the dot, so no duplicate.

    The body is one 16 MB line, so all of it goes out in the same write as the
    final dot; the peer's small receive buffer keeps most of it unsent."""
    size = 16 << 20
    script = _until_data(b"354 go\r\n") + [("read", size // 4), ("close",)]
    with ScriptedPeer(script, rcvbuf=65536) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test",
                                  message=b"Subject: long\n\n" + b"x" * size + b"\n")
        assert peer.done.wait(30)
    assert records == [b"r", b"ZConnected to 127.0.0.1 but connection died. (#4.4.2)\n"]
    assert b"\r\n.\r\n" not in peer.received[0]


def test_partial_final_line_drops_connection_mid_data(qmail_home):
    script = _until_data(b"354 go\r\n") + [("data",), ("send", b"250 should not get here\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test",
                                  message=b"Subject: x\n\nno newline at the end")
        assert peer.done.wait(30)
    assert records == [b"r", b"DSMTP cannot transfer messages with partial final lines. (#5.6.2)\n"]
    wire = peer.received[0]
    assert wire.endswith(b"DATA\r\n") or b"\r\n.\r\n" not in wire[wire.index(b"DATA\r\n"):]
    assert not wire.endswith(b"QUIT\r\n")


@pytest.mark.parametrize("sender,recipient,mail,rcpt", [
    (b"", b"joe@x.test", b"<>", b"<joe@x.test>"),
    (b"#@[]", b"postmaster@x.test", b"<#@[]>", b"<postmaster@x.test>"),
    (b"a b@c.example", b"x.y.@x.test", b'<"a b"@c.example>', b'<"x.y."@x.test>'),
    (b"owner-joe=y.org@lists.example", b'we"ird@x.test', b"<owner-joe=y.org@lists.example>",
     b'<"we\\"ird"@x.test>'),
])
def test_addresses_on_the_wire(qmail_home, sender, recipient, mail, rcpt):
    with ScriptedPeer(_until_data(b"554 stop\r\n")) as peer:
        route(qmail_home, "x.test", peer.port)
        qmail_remote(qmail_home, "x.test", sender, recipient)
        assert peer.done.wait(30)
    assert b"MAIL FROM:" + mail + b"\r\nRCPT TO:" + rcpt + b"\r\n" in peer.received[0]


def test_address_with_line_end_is_refused_before_connecting(qmail_home):
    with ScriptedPeer([("send", b"220 p\r\n")]) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe\r\nDATA@x.test")
    assert records == [b"DSorry, an address with a CR or LF cannot be sent by SMTP. (#5.1.3)\n"]
    assert peer.connections == 0


def test_usage_and_controls(qmail_home):
    code, records = qmail_remote(qmail_home, "x.test", b"a@b.example")
    assert (code, records) == (0, [b"DI (qmail-remote) was invoked improperly. (#5.3.5)\n"])
    import os
    os.unlink(os.path.join(qmail_home.path, "control", "me"))
    _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"ZUnable to read control files. (#4.3.0)\n"]


def test_best_mx_is_this_host(qmail_home):
    """An IP literal naming one of our own addresses is 'best MX but not in locals'."""
    for host in ("127.0.0.1", "[127.0.0.1]", "0.0.0.0"):
        _, records = qmail_remote(qmail_home, host, b"a@b.example", b"joe@" + host.encode())
        assert records == [b"DSorry. Although I'm listed as a best-preference MX or A for that host,\n"
                           b"it isn't in my control/locals file, so I don't treat it as local. (#5.4.6)\n"]


def test_routes_pick_the_longest_suffix(qmail_home):
    with Smtpd() as good, Smtpd() as other:
        qmail_home.control("smtproutes", "".join([
            "x.test:[127.0.0.1]:%d\n" % other.port,
            ".x.test:[127.0.0.1]:%d\n" % other.port,
            ".deep.x.test:[127.0.0.1]:%d\n" % good.port,
            "SHOUT.TEST:[127.0.0.1]:%d\n" % good.port,
            ":[127.0.0.1]:%d\n" % other.port,
        ]))
        _, r1 = qmail_remote(qmail_home, "a.deep.x.test", b"a@b", b"u@a.deep.x.test")
        _, r2 = qmail_remote(qmail_home, "shout.test", b"a@b", b"u@shout.test")
        _, r3 = qmail_remote(qmail_home, "elsewhere.example", b"a@b", b"u@elsewhere.example")
    assert r1[-1].startswith(b"K") and r2[-1].startswith(b"K") and r3[-1].startswith(b"K")
    assert [t.rcpt_tos for t in good.transactions] == [["u@a.deep.x.test"], ["u@shout.test"]]
    assert [t.rcpt_tos for t in other.transactions] == [["u@elsewhere.example"]]


def _encode(message, chunk):
    from qmailpy.remote.smtp import body_chunks
    r, w = os.pipe()
    try:
        os.write(w, message)
        os.close(w)
        return b"".join(body_chunks(r, chunk))
    finally:
        os.close(r)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b".", b"x", b"\xe9"]), max_size=40),
       st.integers(min_value=1, max_value=7))
def test_body_encoding_property(parts, chunk):
    """Any message ending in a line end: only CRLF on the wire, every line dot-stuffed,
    and undoing SMTP's dot-stuffing gives the message's lines back (docs/delivery.md "SMTP dialogue"; docs/submission.md "qmail-smtpd")."""
    message = b"".join(parts) + b"\n"
    wire = _encode(message, chunk)
    assert no_bare_line_ends(wire)
    assert wire.endswith(b"\r\n")
    lines = wire[:-2].split(b"\r\n")
    assert all(not line.startswith(b".") or line.startswith(b"..") for line in lines)
    expected = message.replace(b"\r\n", b"\n").replace(b"\r", b"\n")[:-1].split(b"\n")
    assert [line[1:] if line.startswith(b".") else line for line in lines] == expected


def test_a_quit_that_cannot_be_written_does_not_undo_the_verdict():
    """The peer takes the message, then cannot be written to (here: it shut down its reading
    side, so QUIT fails with EPIPE at once, on a real socket pair): still K. A Z "connection
    died" without "Possible duplicate!" would make qmail-send deliver the message again."""
    import socket
    import threading
    from qmailpy.remote import smtp
    ours, theirs = socket.socketpair()

    def peer():
        with theirs, theirs.makefile("rb") as lines:
            theirs.sendall(b"220 p\r\n")
            for reply in (b"250 p\r\n", b"250 ok\r\n", b"250 ok\r\n", b"354 go\r\n"):
                lines.readline()
                theirs.sendall(reply)
            while lines.readline() not in (b".\r\n", b""):
                pass
            theirs.shutdown(socket.SHUT_RD)
            theirs.sendall(b"250 taken\r\n")
    thread = threading.Thread(target=peer)
    thread.start()
    r, w = os.pipe()
    os.write(w, b"Subject: once\n\nonly once\n")
    os.close(w)
    records = []
    try:
        verdict = smtp.dialogue(smtp.Connection(ours, 30), b"127.0.0.1", b"h.example",
                                b"a@b.example", [b"joe@x.test"], r, records)
    finally:
        os.close(r)
        thread.join(30)
    assert records == [b"r"]
    assert verdict == b"K127.0.0.1 accepted message.\nRemote host said: 250 taken\n"
