"""MX and address lookups (docs/delivery.md "qmail-remote") against a real DNS server on 127.0.0.1.

The server answers from records built from text with dnspython; qmail-remote's
lookup code talks to it over UDP through a dnspython resolver pointed at it.
"""
import os
import socket

import dns.message
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset
import pytest

from dns_harness import DNSServer
from qmailpy.remote import deliver, dns as rdns
from remote_harness import ScriptedPeer, closed_port

ZONE = {
    "x.test.": {"MX": ["10 mx1.x.test.", "20 mx2.x.test.", "10 mx3.x.test."]},
    "mx1.x.test.": {"A": ["127.0.0.11", "127.0.0.12"]},
    "mx2.x.test.": {"A": ["127.0.0.20"]},
    "mx3.x.test.": {"A": ["127.0.0.31"]},
    "plain.test.": {"A": ["127.0.0.40"]},
    "self.test.": {"MX": ["10 me.self.test.", "20 other.self.test."]},
    "me.self.test.": {"A": ["127.0.0.1"]},
    "other.self.test.": {"A": ["127.0.0.50"]},
    "backup.test.": {"MX": ["5 gone.backup.test.", "10 me.self.test."]},
    "gone.backup.test.": {"A": ["127.0.0.9"]},
    "halfsoft.test.": {"MX": ["10 broken.test.", "20 mx2.x.test."]},
    "allsoft.test.": {"MX": ["10 broken.test."]},
    "nomx-noa.test.": {"TXT": ['"nothing"']},
    "deadmx.test.": {"MX": ["10 nowhere.test."]},
}
SERVFAIL = {"broken.test.", "soft.test."}


@pytest.fixture(scope="module")
def server():
    s = DNSServer(ZONE, SERVFAIL)
    yield s
    s.close()


def ips(found):
    return [(pref, socket.inet_ntoa(ip)) for pref, ip, _ in found]


SEEDS = [1763790000 + (pid << 16) for pid in range(300)]       # time + pid << 16


def test_mx_order_over_the_wire(server):
    seen = set()
    for seed in SEEDS[:40]:
        found, soft = rdns.mx_addresses(b"x.test", seed, server.lookup())
        assert not soft
        order = ips(found)
        assert sorted(order, key=lambda x: x[0]) == order           # by preference
        assert order[-1] == (20, "127.0.0.20")
        first10 = [ip for pref, ip in order if pref == 10]
        assert sorted(first10) == ["127.0.0.11", "127.0.0.12", "127.0.0.31"]
        assert first10[0] == "127.0.0.31" or first10[2] == "127.0.0.31"   # one host's A together
        seen.add(first10.index("127.0.0.31"))
    assert seen == {0, 2}                                            # ties are randomised


def test_each_host_keeps_dns_order():
    answers = {b"m.test": dns.rrset.from_text("m.test.", 60, "IN", "MX", "10 h.m.test."),
               b"h.m.test": dns.rrset.from_text("h.m.test.", 60, "IN", "A", "127.0.0.3", "127.0.0.1",
                                                "127.0.0.2")}
    def lookup(name, rdtype):
        if rdtype != answers[name].rdtype.name:
            raise rdns.DNSHard("no data")
        return list(answers[name])
    found, _ = rdns.mx_addresses(b"m.test", 1, lookup)
    assert ips(found) == [(10, "127.0.0.3"), (10, "127.0.0.1"), (10, "127.0.0.2")]


def test_order_mx_with_answer_objects_from_text():
    rrset = dns.rrset.from_text("t.test.", 60, "IN", "MX", "30 c.t.test.", "10 a.t.test.",
                                "20 b.t.test.", "10 d.t.test.", "10 e.t.test.")
    records = [(rd.preference, rd.exchange.to_text()) for rd in rrset]
    orders = [tuple(name for _, name in rdns.order_mx(records, seed)) for seed in SEEDS]
    for order in orders:
        assert set(order[:3]) == {"a.t.test.", "d.t.test.", "e.t.test."}
        assert order[3:] == ("b.t.test.", "c.t.test.")
    assert len(set(orders)) == 6                                     # every tie order occurs
    firsts = [order[0] for order in orders]
    assert min(firsts.count(n) for n in ("a.t.test.", "d.t.test.", "e.t.test.")) > 50
    assert rdns.order_mx(records, 7) == rdns.order_mx(records, 7)    # the seed decides


def test_no_mx_falls_back_to_a(server):
    assert ips(rdns.mx_addresses(b"plain.test", 1, server.lookup())[0]) == [(0, "127.0.0.40")]


def test_soft_failures(server):
    with pytest.raises(rdns.DNSSoft):
        rdns.mx_addresses(b"soft.test", 1, server.lookup())
    found, soft = rdns.mx_addresses(b"halfsoft.test", 1, server.lookup())
    assert soft and ips(found) == [(20, "127.0.0.20")]
    found, soft = rdns.mx_addresses(b"allsoft.test", 1, server.lookup())
    assert soft and found == []


def test_hard_failures(server):
    with pytest.raises(rdns.DNSHard):
        rdns.mx_addresses(b"nxdomain.test", 1, server.lookup())
    with pytest.raises(rdns.DNSHard):
        rdns.mx_addresses(b"nomx-noa.test", 1, server.lookup())
    assert rdns.mx_addresses(b"deadmx.test", 1, server.lookup()) == ([], False)


def test_ip_literals_need_no_dns():
    def no_dns(name, rdtype):
        raise AssertionError("DNS was asked for %r" % name)
    for host in (b"192.0.2.7", b"[192.0.2.7]"):
        assert ips(rdns.mx_addresses(host, 1, no_dns)[0]) == [(0, "192.0.2.7")]
    assert rdns.ip_literal(b"[1.2.3]") is None and rdns.ip_literal(b"a.b.c.d") is None


def test_local_addresses_include_loopback_and_any():
    mine = rdns.local_addresses()
    assert socket.inet_aton("127.0.0.1") in mine and bytes(4) in mine


def run_deliver(home, host, server, monkeypatch, port=None):
    if port is not None:
        monkeypatch.setattr("qmailpy.remote.routes.SMTP_PORT", port)
    cwd = os.getcwd()
    try:
        return deliver.deliver([host, b"a@b.example", b"joe@" + host], home.path,
                               messfd=os.open(os.devnull, os.O_RDONLY), lookup=server.lookup())
    finally:
        os.chdir(cwd)


def test_results_of_lookups(qmail_home, server, monkeypatch):
    assert run_deliver(qmail_home, b"soft.test", server, monkeypatch) == [
        b"ZSorry, I couldn't find any host by that name. (#4.1.2)\n"]
    assert run_deliver(qmail_home, b"allsoft.test", server, monkeypatch) == [
        b"ZSorry, I couldn't find any host by that name. (#4.1.2)\n"]
    assert run_deliver(qmail_home, b"nxdomain.test", server, monkeypatch) == [
        b"DSorry, I couldn't find any host named nxdomain.test. (#5.1.2)\n"]
    assert run_deliver(qmail_home, b"deadmx.test", server, monkeypatch) == [
        b"DSorry, I couldn't find a mail exchanger or IP address. (#5.4.4)\n"]


@pytest.mark.slow
def test_best_mx_not_in_locals(qmail_home, server, monkeypatch):
    assert run_deliver(qmail_home, b"self.test", server, monkeypatch) == [
        b"DSorry. Although I'm listed as a best-preference MX or A for that host,\n"
        b"it isn't in my control/locals file, so I don't treat it as local. (#5.4.6)\n"]


@pytest.mark.slow
def test_only_mx_better_than_ours_are_tried(qmail_home, server, monkeypatch):
    """backup.test: MX 5 is 127.0.0.x without a listener, MX 10 is this host: never connect to ourselves."""
    port = closed_port()
    with ScriptedPeer([("send", b"554 not me\r\n")], host="127.0.0.1", port=port) as me:
        records = run_deliver(qmail_home, b"backup.test", server, monkeypatch, port=port)
    assert records == [b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n"]
    assert me.connections == 0


@pytest.mark.slow
def test_delivery_through_mx(qmail_home, server, monkeypatch):
    with ScriptedPeer([("send", b"220 mx\r\n"), ("line",), ("send", b"250 mx\r\n"), ("line",),
                       ("send", b"250 ok\r\n"), ("line",), ("send", b"550 no such user\r\n")],
                      host="127.0.0.40") as peer:
        records = run_deliver(qmail_home, b"plain.test", server, monkeypatch, port=peer.port)
    assert records == [b"h127.0.0.40 does not like recipient.\nRemote host said: 550 no such user\n",
                       b"DGiving up on 127.0.0.40.\n"]
