"""qmail-remote's STARTTLS and its policy file (docs/delivery.md "STARTTLS"), and SMTPUTF8 on relay
(docs/delivery.md "SMTPUTF8"), against aiosmtpd and scripted peers on 127.0.0.1.

Certificates come from tls_certs.py (the openssl program): a CA, a certificate for x.test
signed by it ("good"), and a self-signed one for x.test that no CA vouches for ("self").
"""
import os
import ssl

import pytest

from remote_harness import ScriptedPeer, Smtpd, qmail_remote, route
from tls_certs import make_certs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(str(tmp_path_factory.mktemp("certs")), dns=("x.test",), ips=())


def server_context(certs, which):
    return certs.server_context() if which == "good" else certs.self_signed_context()


def trust(home, certs, policy_line):
    """control/testca.pem is the test CA; control/tlsdestinations holds policy_line."""
    with open(certs.ca, "rb") as f:
        home.control("testca.pem", f.read())
    home.control("tlsdestinations", policy_line)


def tls_line(record):
    return next((line for line in record.split(b"\n") if line.startswith(b"TLS: ")), None)


@pytest.mark.parametrize("which", ["good", "self"])
def test_opportunistic_tls_is_used_and_logged(qmail_home, certs, which):
    """No policy: STARTTLS when offered, whatever the certificate."""
    with Smtpd(tls_context=server_context(certs, which), require_starttls=True) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records[0] == b"r"
    assert records[1].startswith(b"K127.0.0.1 accepted message.\nTLS: TLSv1.")
    [t] = peer.transactions
    assert t.tls is not None
    assert tls_line(records[1]) == ("TLS: %s %s" % t.tls).encode()


def test_required_and_verified(qmail_home, certs):
    trust(qmail_home, certs, "# mail to x.test only encrypted\nx.test:control/testca.pem\n")
    with Smtpd(tls_context=certs.server_context()) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records[1].startswith(b"K127.0.0.1 accepted message.\nTLS: TLSv1.")
    [t] = peer.transactions
    assert t.tls is not None and t.rcpt_tos == ["joe@x.test"]


@pytest.mark.parametrize("which,policy,reason", [
    ("self", "x.test:control/testca.pem\n", b"certificate: self-signed certificate"),
    ("good", ".test\n", b"certificate: unable to get local issuer certificate"),     # system CAs
    ("good", "x.test:control/testca.pem\n", None),                 # verified, but for another name
])
def test_required_and_not_verified_is_deferred(qmail_home, certs, which, policy, reason):
    trust(qmail_home, certs, policy)
    host = "x.test" if reason else "y.x.test"
    qmail_home.control("tlsdestinations", policy.replace("x.test", host) if not reason else policy)
    with Smtpd(tls_context=server_context(certs, which)) as peer:
        route(qmail_home, host, peer.port)
        _, records = qmail_remote(qmail_home, host, b"a@b.example", b"joe@" + host.encode())
    [record] = records
    assert record.startswith(b"ZConnected to 127.0.0.1 but ")
    assert record.endswith(b"(#4.7.5)\n")
    if reason:
        assert b"the TLS handshake failed: " + reason in record
    else:
        assert b"its certificate names none of y.x.test." in record
    assert peer.transactions == []


def test_required_but_not_offered_sends_nothing_in_clear(qmail_home, certs):
    trust(qmail_home, certs, "x.test\n")
    script = [("send", b"220 p ESMTP\r\n"), ("line",), ("send", b"250-p\r\n250 8BITMIME\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"ZConnected to 127.0.0.1 but it does not offer STARTTLS, which "
                       b"control/tlsdestinations requires. (#4.7.5)\n"]
    assert peer.received[0] == b"EHLO test.example\r\nQUIT\r\n"


def test_opportunistic_without_starttls_goes_in_clear(qmail_home):
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records[1] == b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"
    assert peer.transactions[0].tls is None


@pytest.mark.parametrize("after", [("close",), ("read", 10), ("hang",)])
def test_peer_drops_mid_handshake(qmail_home, after):
    """Cut before or in the middle of the handshake, or a handshake that never ends
    (timeoutremote bounds it); under a required policy, so no clear retry follows."""
    qmail_home.control("timeoutremote", "1\n")
    qmail_home.control("tlsdestinations", "x.test\n")
    script = [("send", b"220 p ESMTP\r\n"), ("line",), ("send", b"250-p\r\n250 STARTTLS\r\n"),
              ("line",), ("send", b"220 go ahead\r\n"), after, ("close",)]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    [record] = records
    assert record.startswith(b"ZConnected to 127.0.0.1 but the TLS handshake failed: ")
    assert peer.received[0].startswith(b"EHLO test.example\r\nSTARTTLS\r\n")
    assert b"MAIL" not in peer.received[0]


def test_tls_failure_tries_the_next_address(qmail_home, certs):
    """The relay's first address (::1, first by RFC 6724; DNS shuffles records of one type) has
    a certificate no CA vouches for, under a required policy; the second (127.0.0.1) has a good
    one and gets the message, encrypted."""
    from net_support import ipv6_loopback
    if not ipv6_loopback():
        pytest.skip("no ::1 on this machine")
    from dns_harness import DNSServer
    from qmailpy.remote import deliver
    trust(qmail_home, certs, "x.test:control/testca.pem\n")
    dns_server = DNSServer({"relay.x.test.": {"A": ["127.0.0.1"], "AAAA": ["::1"]}}, set())
    with Smtpd(host="::1", tls_context=certs.self_signed_context()) as bad, \
            Smtpd(port=bad.port, tls_context=certs.server_context()) as good:
        qmail_home.control("smtproutes", "x.test:relay.x.test:%d\n" % bad.port)
        cwd = os.getcwd()
        try:
            records = deliver.deliver([b"x.test", b"a@b.example", b"joe@x.test"], qmail_home.path,
                                      messfd=os.open(os.devnull, os.O_RDONLY), lookup=dns_server.lookup())
        finally:
            os.chdir(cwd)
            dns_server.close()
    assert records[-1].startswith(b"K127.0.0.1 accepted message.\nTLS: TLSv1."), records
    assert bad.transactions == []
    assert len(good.transactions) == 1 and good.transactions[0].tls is not None


def test_opportunistic_tls_that_fails_is_retried_in_clear(qmail_home):
    """A peer that offers STARTTLS but cannot finish a handshake (its TLS context has no
    certificate) gets the message on a second connection, in clear."""
    broken = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with Smtpd(tls_context=broken) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    # the report tells why a peer that offers STARTTLS got the message in clear
    assert records[-1].startswith(b"K127.0.0.1 accepted message.\nTLS: none, the TLS handshake "
                                  b"failed: "), records
    assert records[-1].endswith(b".\nRemote host said: 250 2.0.0 Ok: queued\n")
    [transaction] = peer.transactions
    assert transaction.tls is None


def test_required_tls_that_fails_is_not_retried_in_clear(qmail_home):
    broken = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)           # no certificate
    qmail_home.control("tlsdestinations", "x.test\n")
    with Smtpd(tls_context=broken) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    [record] = records
    assert record.startswith(b"ZConnected to 127.0.0.1 but the TLS handshake failed: "), record
    assert peer.transactions == []


def test_starttls_refused_is_temporary(qmail_home):
    """Under a required policy (opportunistically, the clear retry would follow)."""
    qmail_home.control("tlsdestinations", "x.test\n")
    script = [("send", b"220 p\r\n"), ("line",), ("send", b"250-p\r\n250 STARTTLS\r\n"),
              ("line",), ("send", b"454 4.7.0 TLS not available\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records == [b"ZConnected to 127.0.0.1 but STARTTLS was refused. (#4.7.5)\n"
                       b"Remote host said: 454 4.7.0 TLS not available\n"]
    assert peer.received[0] == b"EHLO test.example\r\nSTARTTLS\r\nQUIT\r\n"


def test_ehlo_unknown_falls_back_to_helo(qmail_home):
    script = [("send", b"220 p\r\n"), ("line",), ("send", b"502 what?\r\n"), ("line",),
              ("send", b"250 p\r\n"), ("line",), ("send", b"250 ok\r\n"), ("line",),
              ("send", b"550 no\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert peer.done.wait(30)
    assert records[-1] == b"DGiving up on 127.0.0.1.\n"
    assert peer.received[0].startswith(b"EHLO test.example\r\nHELO test.example\r\nMAIL FROM:")


# --- SMTPUTF8 ---------------------------------------------------------------------------

UTF8_SENDER = "jöe@b.example".encode()
UTF8_RCPT = "ünï@x.test".encode()


def test_smtputf8_relay_to_a_peer_that_offers_it(qmail_home):
    with Smtpd(smtputf8=True) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", UTF8_SENDER, UTF8_RCPT, b"plain@x.test")
    assert records[-1].startswith(b"K127.0.0.1 accepted message.")
    [t] = peer.transactions
    assert t.smtp_utf8 and t.mail_options == []
    assert (t.mail_from, t.rcpt_tos) == ("jöe@b.example", ["ünï@x.test", "plain@x.test"])


def test_smtputf8_needed_but_not_offered_bounces(qmail_home):
    script = [("send", b"220 p\r\n"), ("line",), ("send", b"250-p\r\n250 8BITMIME\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", UTF8_RCPT)
        assert peer.done.wait(30)
    assert records == [b"DSorry, 127.0.0.1 does not support SMTPUTF8 and an address is not ASCII: "
                       b"553 5.6.7 non-ASCII addresses are not permitted for that recipient. (#5.6.7)\n"]
    assert peer.received[0] == b"EHLO test.example\r\nQUIT\r\n"


def test_a_utf8_recipient_among_ascii_ones_is_refused_alone(qmail_home):
    """One run for several recipients (as qmail-rspawn's workers make it): to a peer without
    SMTPUTF8 the UTF-8 recipient gets its own permanent refusal, the ASCII one the message."""
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", UTF8_RCPT, b"joe@x.test")
    assert records[0] == (b"hSorry, 127.0.0.1 does not support SMTPUTF8 and an address is not ASCII: "
                          b"553 5.6.7 non-ASCII addresses are not permitted for that recipient. (#5.6.7)\n")
    assert records[1:] == [b"r", b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"]
    [t] = peer.transactions
    assert t.rcpt_tos == ["joe@x.test"] and not t.smtp_utf8
    # a UTF-8 sender concerns every recipient
    with ScriptedPeer(NO_SMTPUTF8) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", UTF8_SENDER, b"joe@x.test", b"ann@x.test")
        assert peer.done.wait(30)
    assert records == [b"DSorry, 127.0.0.1 does not support SMTPUTF8 and an address is not ASCII: "
                       b"553 5.6.7 non-ASCII addresses are not permitted for that recipient. (#5.6.7)\n"]
    assert peer.received[0] == b"EHLO test.example\r\nQUIT\r\n"


def test_utf8_and_ascii_recipients_of_one_message_through_rspawn_workers(qmail_home):
    """qmail-rspawn's workers give both recipients to one run: the ASCII one's delivery is
    not held back by the other's refusal (it was bounced with it), and the UTF-8 one bounces
    with the #5.6.7 reason, the reply a run of its own gives, byte for byte."""
    from rspawn_harness import Rspawn, put_message
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        m = put_message(qmail_home, 4100, b"Subject: hi\n\nbody\n")
        rs = Rspawn(qmail_home)
        rs.commands([(0, m, b"a@b.example", UTF8_RCPT), (1, m, b"a@b.example", b"ann@x.test")])
        got = rs.replies(2)
        rs.finish()
    [t] = peer.transactions
    assert t.rcpt_tos == ["ann@x.test"]
    assert got[1] == b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"
    assert got[0] == (b"DSorry, 127.0.0.1 does not support SMTPUTF8 and an address is not ASCII: "
                      b"553 5.6.7 non-ASCII addresses are not permitted for that recipient. (#5.6.7)\n")


def test_ascii_envelope_does_not_ask_for_smtputf8(qmail_home):
    with Smtpd(smtputf8=True) as peer:
        route(qmail_home, "x.test", peer.port)
        qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert not peer.transactions[0].smtp_utf8


def test_tls_in_qmail_send_log(qmail_home, certs):
    """The TLS line reaches qmail-send's delivery log line, through qmail-rspawn."""
    from send_harness import Daemons
    with Smtpd(tls_context=certs.server_context()) as peer:
        trust(qmail_home, certs, "x.test:control/testca.pem\n")
        route(qmail_home, "x.test", peer.port)
        daemons = Daemons(qmail_home)
        try:
            daemons.start()
            daemons.wait_line(r"^status: ")
            done = qmail_home.queue_message(b"Subject: t\n\nhi\n", b"a@b.example", [b"joe@x.test"])
            assert done.returncode == 0, done.stderr
            lines = daemons.wait_line(r"^delivery 1: ")
        finally:
            daemons.kill()
    [line] = [l for l in lines if l.startswith("delivery 1: ")]
    version, cipher = peer.transactions[0].tls
    assert line == ("delivery 1: success: 127.0.0.1_accepted_message./TLS:_%s_%s/"
                    "Remote_host_said:_250_2.0.0_Ok:_queued/" % (version, cipher))


def test_certificate_name_rules():
    from qmailpy.remote.tls import names_match
    cert = {"subjectAltName": (("DNS", "mx.x.test"), ("DNS", "*.y.test"), ("IP Address", "127.0.0.1")),
            "subject": ((("commonName", "cn.test"),),)}
    assert names_match(cert, [b"MX.X.test"]) and names_match(cert, [b"a.y.test"])
    assert not names_match(cert, [b"y.test"]) and not names_match(cert, [b"a.b.y.test"])
    assert not names_match(cert, [b"cn.test"])             # a subjectAltName hides the commonName
    assert names_match({"subject": ((("commonName", "cn.test"),),)}, [b"other.test", b"cn.test"])
    assert not names_match(cert, [b"127.0.0.1"])


# A message as qmail-smtpd queues it after MAIL FROM with SMTPUTF8 (docs/submission.md), with
# UTF-8 in its header, then one that came without SMTPUTF8 with the same 8-bit header.
UTF8_HEADER = "Subject: grüße\nFrom: Jörg <a@b.example>\n\nbody\n".encode()
FLAGGED = (b"Received: (qmail 4414 invoked from network); 1 Jan 2030 00:00:00 -0000\n"
           b"Received: from unknown (HELO c.example) (127.0.0.1)\n"
           b"  by test.example with (TLSv1.3:TLS_AES_256_GCM_SHA384 encrypted) UTF8SMTP;"
           b" 1 Jan 2030 00:00:00 -0000\n" + UTF8_HEADER)
LEGACY = (b"Received: from unknown (HELO c.example) (127.0.0.1)\n"
          b"  by test.example with SMTP; 1 Jan 2030 00:00:00 -0000\n" + UTF8_HEADER)
FLAGGED_ASCII = FLAGGED.replace(UTF8_HEADER, b"Subject: gruesse\nFrom: Joerg <a@b.example>\n\nbody\n")
NO_SMTPUTF8 = [("send", b"220 p\r\n"), ("line",), ("send", b"250-p\r\n250 8BITMIME\r\n")]


def test_which_messages_came_in_with_smtputf8():
    from qmailpy.remote.smtputf8 import classify
    m = classify(b"Delivered-To: x@y\nreceived: from a\n\tby b with\n UTF8SMTPS; date\nSubject: \xc3\xa9\n")
    assert m.flagged and m.header_8bit and m.needs_smtputf8
    m = classify(FLAGGED_ASCII.split(b"\n\n")[0])
    assert m.flagged and not m.header_8bit
    # only the topmost Received line naming a protocol counts: an earlier hop's is not this one's
    m = classify(LEGACY.split(b"\n\n")[0] + b"\nReceived: from x by y with UTF8SMTP; d")
    assert not m.flagged and m.header_8bit and not m.needs_smtputf8
    assert not classify(b"Subject: with UTF8SMTP\n").flagged
    assert not classify(b"Received: by y with UTF8SMTPX; d\n").flagged
    assert not classify(b"Received: (qmail 1 invoked by uid 0); d\nSubject: \xc3\xa9\n").flagged


def test_a_flagged_utf8_header_is_not_sent_to_a_peer_without_smtputf8(qmail_home):
    """RFC 6531 §3.2: no message with UTF-8 in its header to such a peer; the envelope is ASCII."""
    with ScriptedPeer(NO_SMTPUTF8) as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test",
                                  message=FLAGGED)
        assert peer.done.wait(30)
    assert records == [b"DSorry, 127.0.0.1 does not support SMTPUTF8, which the message needs: it "
                       b"came in with SMTPUTF8 and its header is not ASCII. (#5.6.7)\n"]
    assert peer.received[0] == b"EHLO test.example\r\nQUIT\r\n"


@pytest.mark.parametrize("message", [LEGACY, FLAGGED_ASCII], ids=["8bit-unflagged", "flagged-ascii"])
def test_what_needs_no_smtputf8_goes_to_a_peer_without_it(qmail_home, message):
    """8-bit header bytes in mail that came without SMTPUTF8 go out as qmail sends them; a
    flagged message whose header is ASCII goes out without the parameter."""
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test",
                                  message=message)
    assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
    [t] = peer.transactions
    assert not t.smtp_utf8 and t.data == message.replace(b"\n", b"\r\n")


@pytest.mark.parametrize("stdin", ["pipe", "file"])
def test_a_flagged_message_asks_for_smtputf8_and_arrives_whole(qmail_home, tmp_path, stdin):
    """From a pipe the header read ahead is sent from memory; from the queue's mess file
    (seekable, as qmail-rspawn gives it) it is read again. A header longer than the part
    looked at (remote/smtputf8.py HEADER_SCAN) and a long body arrive byte for byte."""
    message = (FLAGGED.split(b"\n\n")[0] + b"\n" + b"X-Filler: %s\n" % (b"f" * 900) * 80
               + b"\n" + b"line %d \xc3\xa9\n" * 1 * 20000)
    message = message.replace(b"%d", b"0")
    with Smtpd(smtputf8=True) as peer:
        route(qmail_home, "x.test", peer.port)
        if stdin == "pipe":
            _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test",
                                      message=message)
        else:
            from qmailpy.remote import deliver
            path = tmp_path / "mess"
            path.write_bytes(message)
            fd = os.open(path, os.O_RDONLY)
            cwd = os.getcwd()
            try:
                records = deliver.deliver([b"x.test", b"a@b.example", b"joe@x.test"],
                                          qmail_home.path, messfd=fd)
            finally:
                os.chdir(cwd)
                os.close(fd)
    assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
    [t] = peer.transactions
    assert t.smtp_utf8
    assert t.data == message.replace(b"\n", b"\r\n")


def test_smtputf8_end_to_end(qmail_home, users, daemons):
    """Received by qmail-smtpd with SMTPUTF8 and relayed by qmail-send: to a peer that offers
    SMTPUTF8 the UTF-8 envelope and header arrive with it; to a peer without it a UTF-8
    recipient (beside an ASCII one, who gets the message), and an ASCII one with a UTF-8
    Subject, each come back to the sender in qmail's bounce with the #5.6.7 reason."""
    import smtplib
    from delivery_support import wait_maildir
    from smtpd_support import ListenerProcess
    me = users.add("me")
    with Smtpd() as old, Smtpd(smtputf8=True) as new:
        qmail_home.control("smtproutes", "x.test:[127.0.0.1]:%d\ny.test:[127.0.0.1]:%d\n"
                           % (old.port, new.port))
        daemons.start()
        daemons.wait_line(r"^status: ")
        with ListenerProcess(qmail_home, env=dict(qmail_home.env, RELAYCLIENT="")) as listener:
            with smtplib.SMTP("127.0.0.1", listener.port, timeout=30) as client:
                for rcpts, subject in ((["ünï@x.test", "ann@x.test"], "plain"),
                                       (["joe@x.test"], "grüße"), (["ünï@y.test"], "grüße")):
                    message = ("Subject: %s\r\n\r\nbody\r\n" % subject).encode()
                    assert client.sendmail("me@test.example", rcpts, message,
                                           mail_options=["SMTPUTF8"]) == {}
            assert listener.stop() == 0
        bounces = wait_maildir(os.path.join(me, "Maildir"), 2)
        daemons.wait_line(r"^delivery \d+: success: 127\.0\.0\.1_accepted_message", 2)
    [t] = old.transactions
    assert t.rcpt_tos == ["ann@x.test"] and not t.smtp_utf8
    assert t.data.endswith(b"Subject: plain\r\n\r\nbody\r\n")
    [t] = new.transactions
    assert t.smtp_utf8 and t.rcpt_tos == ["ünï@y.test"]
    assert t.data.endswith("Subject: grüße\r\n\r\nbody\r\n".encode())
    texts = b"\n".join(bounces)
    assert texts.count(b"From: MAILER-DAEMON@test.example") == 2
    assert ("<ünï@x.test>:\nSorry, 127.0.0.1 does not support SMTPUTF8 and an address is not "
            "ASCII: 553 5.6.7 non-ASCII addresses").encode() in texts
    assert (b"<joe@x.test>:\nSorry, 127.0.0.1 does not support SMTPUTF8, which the message needs: "
            b"it came in with SMTPUTF8 and its header is not ASCII. (#5.6.7)") in texts
