"""DNSBLs at connect in qmail-smtpd (docs/submission.md "DNSBLs"): zones served by dnsmasq
(dns_harness.py) through control/dnsresolvers; the real qmail-smtpd on a socket pair.
"""
import time

import pytest

from dns_harness import Dnsmasq, Silent
from qmailpy.smtpd import dnsbl
from smtpd_support import SmtpdProcess
from smtpd_tls_support import certs, tls_home  # noqa: F401  (fixtures: a TLS home with checkpassword)

GREETING = b"220 test.example ESMTP\r\n"
LISTED_TXT = "listed for spam; see https://bl.test/q?192.0.2.7"


@pytest.fixture
def zones(qmail_home):
    with Dnsmasq(["host-record=7.2.0.192.bl.test,127.0.0.2",
                  "txt-record=7.2.0.192.bl.test,%s" % LISTED_TXT,
                  "host-record=7.2.0.192.hard.test,127.0.0.2"]) as server:
        qmail_home.control("dnsresolvers", server.control_line())
        yield server


@pytest.mark.slow
def test_listed_client_refused_every_command_but_quit(qmail_home, zones):
    qmail_home.control("dnsbl", "clean.test\nbl.test:553\n")
    with SmtpdProcess(qmail_home) as s:
        assert s.reply() == GREETING
        refused = b"553 " + LISTED_TXT.encode() + b"\r\n"
        assert s.command(b"EHLO client.example\r\n").startswith(b"250-test.example")
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"
        for command in (b"MAIL FROM:<a@b.example>\r\n", b"RCPT TO:<x@test.example>\r\n",
                        b"DATA\r\n", b"VRFY x\r\n", b"XYZZY\r\n"):
            assert s.command(command) == refused, command
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    assert b"qmail-smtpd: dnsbl: bl.test lists 192.0.2.7: " + LISTED_TXT.encode() + b"\n" in s.stderr


@pytest.mark.slow
def test_default_451_and_text_without_txt_record(qmail_home, zones):
    qmail_home.control("dnsbl", "hard.test\n")
    with SmtpdProcess(qmail_home) as s:
        assert s.reply() == GREETING
        assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"451 192.0.2.7 is listed in hard.test\r\n"


@pytest.mark.slow
def test_unlisted_and_relay_clients_pass(qmail_home, zones):
    qmail_home.control("dnsbl", "bl.test:553\n")
    with SmtpdProcess(qmail_home, TCPREMOTEIP="192.0.2.8") as s:
        assert s.reply() == GREETING
        assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"250 ok\r\n"
    with SmtpdProcess(qmail_home, RELAYCLIENT="") as s:
        assert s.reply() == GREETING
        assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    assert b"dnsbl" not in s.stderr


@pytest.mark.slow
def test_lookup_failure_is_temporary_never_a_pass(qmail_home):
    with Silent() as silent:
        qmail_home.control("dnsresolvers", silent.control_line())
        qmail_home.control("timeoutdns", "1\n")
        qmail_home.control("dnsbl", "bl.test:553\n")
        started = time.monotonic()
        with SmtpdProcess(qmail_home) as s:
            assert s.reply() == GREETING
            assert s.command(b"MAIL FROM:<a@b.example>\r\n") == dnsbl.TEMPORARY
            assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
            assert s.close() == 0
        assert time.monotonic() - started < 10
    assert b"qmail-smtpd: dnsbl: bl.test: lookup of 192.0.2.7 failed: " in s.stderr


def test_bad_zone_line_is_421(qmail_home):
    qmail_home.control("dnsbl", "bl.test:550\n")
    with SmtpdProcess(qmail_home) as s:
        assert s.rest() == b"421 unable to read controls (#4.3.0)\r\n"


@pytest.mark.parametrize("ip, name", [
    (b"192.0.2.7", b"7.2.0.192.bl.test"),
    (b"2001:db8::1", b"1." + b"0." * 23 + b"8.b.d.0.1.0.0.2.bl.test"),
    (b"unknown", None),
])
def test_query_names(ip, name):
    assert dnsbl.query_name(ip, b"bl.test") == name


@pytest.mark.slow
def test_authenticated_user_exempt(tls_home, certs, zones):
    from smtpd_tls_support import tls_session
    tls_home.control("dnsbl", "bl.test:553\n")
    with tls_session(tls_home, certs, SMTPAUTH="") as s:
        assert s.command(b"MAIL FROM:<alice@test.example>\r\n").startswith(b"553 listed for spam")
        assert s.command(b"AUTH PLAIN AGFsaWNlAHMzY3JldA==\r\n") == b"235 ok, go ahead (#2.0.0)\r\n"
        assert s.command(b"MAIL FROM:<alice@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<bob@far.example>\r\n") == b"250 ok\r\n"
        s.command(b"QUIT\r\n")
        assert s.close() == 0
