"""qmail-remote over IPv6 (docs/delivery.md "IPv6"): AAAA records, RFC 6724 order, IPv6 literals
and smtproutes relays, control/outgoingip, lock/tcpto6. The exchangers listen on ::1; the DNS
answers come from the real DNS server of test_remote_dns on 127.0.0.1."""
import os
import socket
import struct

import pytest

from dns_harness import DNSServer
from net_support import needs_ipv6
from qmailpy.remote import addrsort, deliver, dns as rdns
from qmailpy.remote.tcpto import Table
from remote_harness import Smtpd, closed_port, qmail_remote, route

V6 = lambda text: socket.inet_pton(socket.AF_INET6, text)      # noqa: E731
V4 = socket.inet_aton

ZONE = {
    "mx6.six.test.": {"AAAA": ["::1"]},
    "dual.test.": {"A": ["127.0.0.1"], "AAAA": ["::1"]},
    "six.test.": {"MX": ["10 mx6.six.test."]},
    "v4.test.": {"A": ["127.0.0.1"]},
}


@pytest.fixture(scope="module")
def server():
    s = DNSServer(ZONE, {"soft6.test."})
    yield s
    s.close()


def run_deliver(home, host, server, recipient=None):
    cwd = os.getcwd()
    try:
        return deliver.deliver([host, b"a@b.example", recipient or b"joe@" + host], home.path,
                               messfd=os.open(os.devnull, os.O_RDONLY), lookup=server.lookup())
    finally:
        os.chdir(cwd)


def test_aaaa_with_a_and_their_order(server):
    assert rdns.mx_addresses(b"six.test", 1, server.lookup()) == ([(10, V6("::1"), b"mx6.six.test")], False)
    # ::1 (precedence 50) before 127.0.0.1 (an IPv4 address counts as ::ffff:0:0/96, 35)
    assert rdns.addresses(b"dual.test", server.lookup()) == [(0, V6("::1"), b"dual.test"),
                                                             (0, V4("127.0.0.1"), b"dual.test")]
    assert rdns.addresses(b"v4.test", server.lookup()) == [(0, V4("127.0.0.1"), b"v4.test")]
    with pytest.raises(rdns.DNSHard):
        rdns.addresses(b"nothing.test", server.lookup())
    with pytest.raises(rdns.DNSSoft):
        rdns.addresses(b"soft6.test", server.lookup())


def test_rfc6724_precedence_and_unusable_last():
    assert [addrsort.precedence(ip) for ip in (
        V6("::1"), V6("2001:db8::1"), V4("192.0.2.1"), V6("2002::1"), V6("2001::1"), V6("fc00::1"),
        V6("::ffff:192.0.2.1"))] == [50, 40, 35, 30, 5, 3, 35]
    # fe80::1 without a scope: the kernel has no route, so it goes last whatever its precedence
    assert addrsort.rfc6724([V6("fe80::1"), V4("127.0.0.1"), V6("::1")]) == [
        V6("::1"), V4("127.0.0.1"), V6("fe80::1")]
    assert addrsort.rfc6724([V4("127.0.0.3"), V4("127.0.0.1")]) == [V4("127.0.0.3"), V4("127.0.0.1")]


@needs_ipv6
def test_ipv6_only_exchanger_by_name(qmail_home, server):
    """A relay named in smtproutes whose only address is an AAAA record on ::1."""
    with Smtpd(host="::1") as peer:
        qmail_home.control("smtproutes", "six.test:mx6.six.test:%d\n" % peer.port)
        records = run_deliver(qmail_home, b"six.test", server)
    assert records == [b"r", b"K::1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"]
    assert peer.transactions[0].rcpt_tos == ["joe@six.test"]


@needs_ipv6
def test_dual_stack_relay_tries_ipv6_first_then_ipv4(qmail_home, server):
    with Smtpd(host="::1") as peer6:
        qmail_home.control("smtproutes", "dual.test:dual.test:%d\n" % peer6.port)
        assert run_deliver(qmail_home, b"dual.test", server)[-1].startswith(b"K::1 accepted")
    port = closed_port()            # nothing on ::1 at this port: refused, then 127.0.0.1
    with Smtpd(port=port) as peer4:
        qmail_home.control("smtproutes", "dual.test:dual.test:%d\n" % port)
        assert run_deliver(qmail_home, b"dual.test", server)[-1].startswith(b"K127.0.0.1 accepted")
    assert len(peer4.transactions) == 1


@needs_ipv6
def test_smtproutes_ipv6_literal(qmail_home):
    for literal in ("::1", "IPv6:::1"):
        with Smtpd(host="::1") as peer:
            route(qmail_home, "x.test", peer.port, host=literal)
            _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
        assert records[-1] == b"K::1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"


def test_ipv6_address_literal_needs_no_dns(qmail_home):
    """user@[IPv6:::1]: the literal is this host's own address, so qmail's rule for a best MX
    that is not in locals applies (#5.4.6), without asking DNS."""
    def no_dns(name, rdtype):
        raise AssertionError("DNS was asked for %r" % name)
    assert rdns.ip_literal(b"[IPv6:2001:DB8::1]") == V6("2001:db8::1")
    assert rdns.ip_literal(b"[IPv6:1.2.3.4]") is None and rdns.ip_literal(b"[IPv6:]") is None
    cwd = os.getcwd()
    try:
        records = deliver.deliver([b"[IPv6:::1]", b"a@b.example", b"joe@[IPv6:::1]"], qmail_home.path,
                                  messfd=os.open(os.devnull, os.O_RDONLY), lookup=no_dns)
    finally:
        os.chdir(cwd)
    assert records == [deliver.PERM_AMBIGMX]


@needs_ipv6
def test_outgoingip_binds_each_family(qmail_home):
    qmail_home.control("outgoingip", "127.0.0.2\n::1\n")
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records[-1].startswith(b"K127.0.0.1 accepted message.")
    assert peer.transactions[0].peer == "127.0.0.2"
    with Smtpd(host="::1") as peer:
        route(qmail_home, "x.test", peer.port, host="::1")
        _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert peer.transactions[0].peer == "::1"


@pytest.mark.slow
@pytest.mark.parametrize("text", ["127.0.0.2\n127.0.0.3\n", "not-an-address\n"])
def test_bad_outgoingip_is_a_control_error(qmail_home, text):
    qmail_home.control("outgoingip", text)
    route(qmail_home, "x.test", closed_port())
    _, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert records == [b"ZUnable to read control files. (#4.3.0)\n"]


@pytest.mark.slow
def test_ipv6_timeouts_go_to_tcpto6(qmail_home):
    lock = os.path.join(qmail_home.queue, "lock")
    assert open(os.path.join(lock, "tcpto6"), "rb").read() == bytes(2048)
    ip = V6("2001:db8::25")
    clock = [100000]
    t = Table(os.path.join(lock, "tcpto"), now=lambda: clock[0], pid=0)
    assert not t.suppressed(ip)
    t.record(ip, True)
    clock[0] += 200
    assert not t.suppressed(ip)
    t.record(ip, True)
    assert t.suppressed(ip)
    assert not t.suppressed(V4("32.1.13.184"))     # the first 4 bytes of 2001:db8:: as IPv4
    assert open(os.path.join(lock, "tcpto"), "rb").read() == bytes(1024)
    data = open(os.path.join(lock, "tcpto6"), "rb").read()
    assert data[:16] == ip and data[16] == 2 and struct.unpack_from("<I", data, 24)[0] == 100200
    assert data[32:] == bytes(2048 - 32)
