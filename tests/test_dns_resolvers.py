"""control/dnsresolvers and control/timeoutdns (docs/control-files.md "DNS"): qmail-remote's
lookups go to the servers listed there, a server that does not answer is a deferral within
the deadline, a bad line is a control-file error. The server is dnsmasq (dns_harness.py).
"""
import time

import pytest

from dns_harness import Dnsmasq, Silent
from qmailpy import resolver
from remote_harness import Smtpd, qmail_remote

TEMP_DNS = b"ZSorry, I couldn't find any host by that name. (#4.1.2)\n"


@pytest.fixture
def dnsmasq():
    with Dnsmasq(["host-record=relay.zone.test,127.0.0.1",
                  "mx-host=self.zone.test,me.zone.test,10",
                  "host-record=me.zone.test,127.0.0.1"]) as server:
        yield server


@pytest.mark.slow
def test_relay_name_resolved_by_listed_server(qmail_home, dnsmasq):
    qmail_home.control("dnsresolvers", "# the test server\n" + dnsmasq.control_line())
    with Smtpd() as peer:
        qmail_home.control("smtproutes", "x.test:relay.zone.test:%d\n" % peer.port)
        code, records = qmail_remote(qmail_home, "x.test", b"a@b.test", b"joe@x.test")
    assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
    assert [t.rcpt_tos for t in peer.transactions] == [["joe@x.test"]]


@pytest.mark.slow
def test_mx_and_missing_names_come_from_listed_server(qmail_home, dnsmasq):
    qmail_home.control("dnsresolvers", dnsmasq.control_line())
    # its MX is this host (127.0.0.1): the lookup was answered by dnsmasq
    _, records = qmail_remote(qmail_home, "self.zone.test", b"a@b.test", b"joe@self.zone.test")
    assert records[-1].startswith(b"DSorry. Although I'm listed as a best-preference MX"), records
    _, records = qmail_remote(qmail_home, "nowhere.zone.test", b"a@b.test", b"joe@nowhere.zone.test")
    assert records == [b"DSorry, I couldn't find any host named nowhere.zone.test. (#5.1.2)\n"]


@pytest.mark.slow
def test_silent_server_defers_within_deadline(qmail_home):
    with Silent() as silent:
        qmail_home.control("dnsresolvers", silent.control_line())
        qmail_home.control("timeoutdns", "2\n")
        started = time.monotonic()
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.test", b"joe@x.test")
        took = time.monotonic() - started
    assert records == [TEMP_DNS]
    assert 2 <= took < 10, took


@pytest.mark.slow
def test_bad_line_is_control_error(qmail_home):
    qmail_home.control("dnsresolvers", "127.0.0.1:53\nname.server.test\n")
    _, records = qmail_remote(qmail_home, "x.test", b"a@b.test", b"joe@x.test")
    assert records == [b"ZUnable to read control files. (#4.3.0)\n"]


@pytest.mark.parametrize("line, server", [
    (b"192.0.2.1", ("192.0.2.1", 53)),
    (b"192.0.2.1:5353", ("192.0.2.1", 5353)),
    (b"2001:db8::53", ("2001:db8::53", 53)),
    (b"[2001:db8::53]", ("2001:db8::53", 53)),
    (b"[2001:db8::53]:5300", ("2001:db8::53", 5300)),
])
def test_server_lines(line, server):
    assert resolver.parse_server(line) == server


@pytest.mark.parametrize("line", [b"ns.test", b"192.0.2.1:0", b"192.0.2.1:x", b"[2001:db8::1",
                                  b"[192.0.2.1]", b"2001:db8::1:53:99999:1:1:1", b"192.0.2.1:70000"])
def test_bad_server_lines(line):
    with pytest.raises(ValueError):
        resolver.parse_server(line)


def test_settings(qmail_home):
    assert resolver.settings(qmail_home.path).servers is None       # /etc/resolv.conf
    qmail_home.control("dnsresolvers", "192.0.2.1\n[2001:db8::53]:5300\n")
    qmail_home.control("timeoutdns", "7\n")
    config = resolver.settings(qmail_home.path)
    assert (config.servers, config.timeout) == ([("192.0.2.1", 53), ("2001:db8::53", 5300)], 7)
    res = resolver.build(config)
    assert res.lifetime == 7 and res.timeout == 5
    assert [(n.address, n.port) for n in res.nameservers] == config.servers
