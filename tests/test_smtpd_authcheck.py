"""SPF, DKIM and DMARC checks on reception in qmail-smtpd (docs/submission.md "Sender
authentication"): SPF, DKIM keys and DMARC records served by dnsmasq (dns_harness.py)
through control/dnsresolvers; the real qmail-smtpd on a socket pair; what reached the queue.
"""
import base64
import os
import sys
import time

import pytest

from dns_harness import Dnsmasq, Silent, txt_strings
from queue_view import queued
from smtpd_support import SmtpdProcess

pytestmark = pytest.mark.slow

GREETING = b"220 test.example ESMTP\r\n"
CLIENT = "192.0.2.7"            # tcp_env's TCPREMOTEIP

MESSAGE = (b"From: Joe <joe@example.test>\r\nTo: ann@test.example\r\nSubject: checked\r\n"
           b"Date: Fri, 27 Nov 2026 03:00:00 +0000\r\nMessage-ID: <1@example.test>\r\n"
           b"\r\nThe body, signed.\r\n")


def signer(domain, selector, kind):
    """(a function message -> its DKIM-Signature field, the TXT record) of a new key."""
    from qmailpy import dkimkeys
    from qmailpy.ctl import dkim as keygen
    from qmailpy.remote import dkimsign
    import tempfile
    private, public = keygen.rsa_key() if kind == "rsa" else keygen.ed25519_key()
    fd, path = tempfile.mkstemp()
    os.write(fd, private)
    os.close(fd)
    entry = dkimkeys.Entry(domain.encode(), selector.encode(), os.fsencode(path))

    def sign(message):
        return dkimsign.sign(message, [entry]).replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    record = "v=DKIM1; k=%s; p=%s" % (kind, base64.b64encode(public).decode())
    return sign, record


@pytest.fixture(scope="module")
def keys():
    rsa, rsa_record = signer("example.test", "rsa1", "rsa")
    ed, ed_record = signer("example.test", "ed1", "ed25519")
    return {"rsa": rsa, "ed25519": ed, "records": [("rsa1._domainkey.example.test", rsa_record),
                                                   ("ed1._domainkey.example.test", ed_record)]}


ZONES = [
    ("example.test", "v=spf1 ip4:192.0.2.7 -all"),
    ("_dmarc.example.test", "v=DMARC1; p=reject; adkim=r; aspf=r; foo=bar; rua=mailto:d@example.test"),
    ("softfail.test", "v=spf1 ~all"),
    ("failing.test", "v=spf1 ip4:198.51.100.1 -all"),
    ("_dmarc.failing.test", "v=DMARC1; p=reject"),
    ("helo.test", "v=spf1 ip4:192.0.2.7 -all"),
    ("loop.test", "v=spf1 include:loop2.test -all"),
    ("loop2.test", "v=spf1 include:loop.test -all"),
    ("many.test", "v=spf1 " + " ".join("include:i%d.test" % i for i in range(11)) + " -all"),
    ("huge.test", "v=spf1 " + " ".join("ip4:10.%d.%d.0/24" % (i // 250, i % 250)
                                       for i in range(950)) + " -all"),
    ("garbage-dmarc.test", "v=spf1 ip4:192.0.2.7 -all"),
    ("_dmarc.garbage-dmarc.test", "v=DMARC1; p=reject; ; zz"),
] + [("i%d.test" % i, "v=spf1 -all") for i in range(11)]


@pytest.fixture(scope="module")
def dns(keys):
    with Dnsmasq(["txt-record=%s,%s" % (name, txt_strings(v)) for name, v in ZONES + keys["records"]]
                 ) as server:
        yield server


@pytest.fixture
def home(qmail_home, dns):
    qmail_home.control("dnsresolvers", dns.control_line())
    qmail_home.control("authcheck", "")
    qmail_home.control("timeoutdns", "5\n")
    return qmail_home


def send(home, sender, message=MESSAGE, helo=b"client.example", **env):
    """The replies to MAIL and to DATA (None when MAIL was refused) and the session's stderr."""
    with SmtpdProcess(home, **env) as s:
        assert s.reply() == GREETING
        assert s.command(b"HELO " + helo + b"\r\n").startswith(b"250 ")
        mail = s.command(b"MAIL FROM:<" + sender + b">\r\n")
        data = None
        if mail.startswith(b"250"):
            assert s.command(b"RCPT TO:<ann@test.example>\r\n") == b"250 ok\r\n"
            assert s.command(b"DATA\r\n") == b"354 go ahead\r\n"
            data = s.command(message + b".\r\n")
        # the session goes on serving after every verdict
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    return mail, data, s.stderr


def results(home):
    """The Authentication-Results fields of the one queued message, and the message."""
    (msg,) = queued(home)
    header = msg.mess.split(b"\n\n")[0].replace(b"\n\t", b" ")
    return [line for line in header.split(b"\n") if line.startswith(b"Authentication-Results:")], msg.mess


SPF_CASES = [
    (b"joe@example.test", b"spf=pass smtp.mailfrom=joe@example.test"),
    (b"joe@failing.test", b"spf=fail smtp.mailfrom=joe@failing.test"),
    (b"joe@softfail.test", b"spf=softfail smtp.mailfrom=joe@softfail.test"),
    (b"joe@nospf.test", b"spf=none smtp.mailfrom=joe@nospf.test"),
    (b"joe@loop.test", b"spf=permerror smtp.mailfrom=joe@loop.test"),        # include loop
    (b"joe@many.test", b"spf=permerror smtp.mailfrom=joe@many.test"),        # 11 lookups
    (b"joe@huge.test", b"spf=fail smtp.mailfrom=joe@huge.test"),             # a 16 kB record
    (b"", b"spf=pass smtp.helo=helo.test"),
]


def test_spf_recorded_and_accepted(home):
    for sender, _ in SPF_CASES:
        mail, data, _ = send(home, sender, helo=b"helo.test")
        assert mail == b"250 ok\r\n" and data.startswith(b"250 ok "), sender
    found = []
    for msg in queued(home):
        header = msg.mess.split(b"\n\n")[0].replace(b"\n ", b" ").replace(b"\n\t", b" ")
        lines = header.split(b"\n")
        # right after qmail-smtpd's Received line
        assert lines[0].startswith(b"Received: (qmail") and lines[1].startswith(b"Received: from")
        assert lines[2].startswith(b"Authentication-Results: test.example; spf=")
        assert [line for line in lines if line.startswith(b"Authentication-Results:")] == [lines[2]]
        found.append(lines[2].split(b"; ")[1])
    assert sorted(found) == sorted(spf for _, spf in SPF_CASES)


def test_spf_fail_refused_when_asked(home):
    home.control("spfreject", "1\n")
    mail, _, stderr = send(home, b"joe@failing.test")
    assert mail == b"550 SPF check failed for failing.test (#5.7.23)\r\n"
    assert b"qmail-smtpd: authcheck: spf fail: joe@failing.test from 192.0.2.7" in stderr
    mail, data, _ = send(home, b"joe@softfail.test")
    assert mail == b"250 ok\r\n" and data.startswith(b"250 ok ")
    assert len(queued(home)) == 1


@pytest.mark.parametrize("kinds", [("rsa",), ("ed25519",), ("rsa", "ed25519")])
def test_dkim_pass_and_dmarc_aligned(home, keys, kinds):
    signed = MESSAGE
    for kind in kinds:
        signed = keys[kind](signed) + signed
    mail, data, _ = send(home, b"bounces@other.test", signed)
    assert data.startswith(b"250 ok ")
    (ar,), mess = results(home)
    for kind in kinds:
        selector = b"rsa1" if kind == "rsa" else b"ed1"
        assert b"dkim=pass header.d=example.test header.s=" + selector + b" header.b=" in ar
    assert ar.endswith(b"dmarc=pass header.from=example.test")
    assert mess.endswith(signed.replace(b"\r\n", b"\n"))     # the message itself unchanged


def test_tampered_message_fails_and_dmarc_reject_is_the_administrators_choice(home, keys):
    tampered = keys["rsa"](MESSAGE) + MESSAGE.replace(b"signed", b"changed")
    mail, data, _ = send(home, b"bounces@other.test", tampered)
    assert data.startswith(b"250 ok ")
    (ar,), _ = results(home)
    assert b"dkim=fail header.d=example.test header.s=rsa1" in ar
    assert ar.endswith(b"dmarc=fail header.from=example.test")
    home.control("dmarcreject", "1\n")
    mail, data, stderr = send(home, b"bounces@other.test", tampered)
    assert data == b"550 DMARC policy of example.test rejects this message (#5.7.1)\r\n"
    assert b"qmail-smtpd: authcheck: dmarc fail: example.test under p=reject" in stderr
    assert len(queued(home)) == 1
    # SPF alone aligns: accepted under dmarcreject
    mail, data, _ = send(home, b"joe@example.test", tampered)
    assert data.startswith(b"250 ok ")


def test_forged_results_with_our_authserv_id_removed(home):
    forged = (b"Authentication-Results: test.example;\r\n\tspf=pass smtp.mailfrom=joe@failing.test;"
              b"\r\n\tdmarc=pass header.from=failing.test\r\n"
              b"Authentication-Results: (comment) TEST.example; dkim=pass\r\n"
              b"Authentication-Results: elsewhere.example; dkim=pass header.d=failing.test\r\n")
    mail, data, _ = send(home, b"joe@failing.test", forged + MESSAGE.replace(b"example.test", b"failing.test"))
    assert data.startswith(b"250 ok ")
    (ours, theirs), mess = results(home)
    assert ours.startswith(b"Authentication-Results: test.example; spf=fail")
    assert ours.endswith(b"dmarc=fail header.from=failing.test")
    assert theirs == b"Authentication-Results: elsewhere.example; dkim=pass header.d=failing.test"
    assert b"(comment)" not in mess


def test_garbage_signature_and_dmarc_record(home):
    garbage = b"DKIM-Signature: v=1; a=rsa-sha256; d=; s==;; b=!!!; bh=\r\n\tzz\r\n"
    message = garbage + MESSAGE.replace(b"example.test", b"garbage-dmarc.test")
    mail, data, _ = send(home, b"joe@garbage-dmarc.test", message)
    assert data.startswith(b"250 ok ")
    (ar,), _ = results(home)
    assert b"spf=pass" in ar and b"dkim=permerror" in ar
    assert ar.endswith(b"dmarc=permerror header.from=garbage-dmarc.test")


def test_dns_failure_is_temperror_never_a_pass(qmail_home):
    with Silent() as silent:
        qmail_home.control("dnsresolvers", silent.control_line())
        qmail_home.control("timeoutdns", "1\n")
        qmail_home.control("authcheck", "")
        started = time.monotonic()
        mail, data, _ = send(qmail_home, b"joe@example.test")
        assert data.startswith(b"250 ok ")
        (ar,), _ = results(qmail_home)
        assert ar.startswith(b"Authentication-Results: test.example; spf=temperror")
        assert ar.endswith(b"dmarc=temperror header.from=example.test")
        qmail_home.control("spfreject", "1\n")
        mail, _, stderr = send(qmail_home, b"joe@example.test")
        assert mail == b"451 temporary SPF lookup error for example.test (#4.7.24)\r\n"
        assert b"qmail-smtpd: authcheck: spf temperror: joe@example.test from 192.0.2.7: " in stderr
        qmail_home.control("spfreject", "0\n")
        qmail_home.control("dmarcreject", "1\n")
        mail, data, _ = send(qmail_home, b"joe@example.test")
        assert data == b"451 temporary DMARC lookup error for example.test (#4.7.1)\r\n"
        assert len(queued(qmail_home)) == 1
        assert time.monotonic() - started < 30


def test_relay_clients_are_not_checked_but_forged_results_go(home):
    forged = b"Authentication-Results: test.example; dmarc=pass header.from=failing.test\r\n"
    mail, data, _ = send(home, b"joe@failing.test", forged + MESSAGE, RELAYCLIENT="")
    assert data.startswith(b"250 ok ")
    fields, mess = results(home)
    assert fields == []
    assert mess.endswith(MESSAGE.replace(b"\r\n", b"\n"))


def test_signatures_beyond_the_bound_are_not_verified(home, keys):
    from qmailpy.smtpd.authcheck import MAX_SIGNATURES
    signed = MESSAGE
    for _ in range(MAX_SIGNATURES + 2):
        signed = keys["ed25519"](MESSAGE) + signed
    mail, data, _ = send(home, b"bounces@other.test", signed)
    assert data.startswith(b"250 ok ")
    (ar,), _ = results(home)
    assert ar.count(b"dkim=pass") == MAX_SIGNATURES
    assert b'dkim=policy reason="2 signatures after the first %d not verified"' % MAX_SIGNATURES in ar


def test_bad_control_is_421(home):
    home.control("authcheck", "spf\nsenderid\n")
    with SmtpdProcess(home) as s:
        assert s.rest() == b"421 unable to read controls (#4.3.0)\r\n"


def test_libraries_imported_only_when_checks_are_on(qmail_home):
    """qmail-smtpd stays fast to start: pyspf, dkimpy and authheaders only with control/authcheck."""
    def imported():
        with SmtpdProcess(qmail_home, argv=(sys.executable, "-X", "importtime", "-m",
                                            "qmailpy.cli.qmail_smtpd")) as s:
            assert s.reply() == GREETING
            s.command(b"QUIT\r\n")
            s.close()
        return {line.split("|")[-1].strip() for line in s.stderr.decode().splitlines()
                if line.startswith("import time:")}
    off = imported()
    assert not {"spf", "dkim", "authheaders"} & off
    assert "qmailpy.smtpd.authcheck" not in off


def test_message_over_the_verify_bound_is_dkim_policy(home, keys):
    """A message too big to verify in memory: dkim=policy, DMARC on SPF alone, the body intact
    and forged results removed on the streaming path too."""
    from qmailpy.smtpd.authcheck import VERIFY_MAX
    forged = b"Authentication-Results: test.example; dkim=pass header.d=example.test\r\n"
    body = MESSAGE + (b"y" * 998 + b"\r\n") * (VERIFY_MAX // 999 + 100)
    mail, data, _ = send(home, b"joe@example.test", forged + keys["rsa"](body) + body)
    assert data.startswith(b"250 ok ")
    (ar,), mess = results(home)
    assert ar == (b"Authentication-Results: test.example; spf=pass smtp.mailfrom=joe@example.test; "
                  b'dkim=policy reason="not verified: over %d bytes"; dmarc=pass header.from=example.test'
                  % VERIFY_MAX)
    assert mess.endswith(body.replace(b"\r\n", b"\n"))


def test_listener_session_worker_keeps_serving(home, keys):
    """Through qmail-smtpd-listen (which preloads the libraries): a refused message and an
    accepted one on one connection, then another connection."""
    import smtplib

    from smtpd_support import TIMEOUT, ListenerProcess
    home.control("dmarcreject", "1\n")
    env = dict(home.env)
    env.pop("RELAYCLIENT", None)
    tampered = keys["rsa"](MESSAGE) + MESSAGE.replace(b"signed", b"changed")
    with ListenerProcess(home, env=env) as listener:
        for _ in range(2):
            with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as c:
                with pytest.raises(smtplib.SMTPDataError) as refused:
                    c.sendmail("bounces@other.test", ["ann@test.example"], tampered)
                assert refused.value.smtp_code == 550
                assert c.sendmail("bounces@other.test", ["ann@test.example"],
                                  keys["ed25519"](MESSAGE) + MESSAGE) == {}
        assert listener.stop() == 0
    for msg in queued(home):
        assert b"dkim=pass header.d=example.test header.s=ed1" in msg.mess
    assert len(queued(home)) == 2


def test_milters_see_the_results(home, keys):
    """With milters too (docs/milter.md), they see the message with our header added and the
    forged one gone; the queued message is what they passed."""
    from milter_peer import MilterPeer
    peer = MilterPeer()
    try:
        home.control("milters", peer.control_line())
        forged = b"Authentication-Results: test.example; dkim=pass\r\n"
        mail, data, _ = send(home, b"joe@example.test", forged + keys["rsa"](MESSAGE) + MESSAGE)
        assert data.startswith(b"250 ok ")
        names = [h.split(b"\0")[0] for h in peer.data_of(b"L")]
        seen = [h.split(b"\0")[1] for h in peer.data_of(b"L") if h.startswith(b"Authentication-Results\0")]
    finally:
        peer.close()
    assert names[:3] == [b"Received", b"Authentication-Results", b"DKIM-Signature"]
    (ar,), _ = results(home)
    assert len(seen) == 1 and seen[0].replace(b"\r", b"").replace(b"\n\t", b" ") == ar.partition(b": ")[2]
    assert b"dkim=pass header.d=example.test" in ar and b"dmarc=pass" in ar
