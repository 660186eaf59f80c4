"""control/smtproutes matching (docs/delivery.md "qmail-remote") and its effect on a real qmail-remote run."""
import pytest

from qmailpy.remote.routes import find_relay, route_table, split_relay
from remote_harness import Smtpd, qmail_remote


def test_matching_rules():
    table = route_table([b"a.example:relay-a", b".example:relay-dot", b".b.example:relay-b",
                         b"EXACT.Example:relay-exact", b"noroute.example:", b"no colon line",
                         b"dup.example:first", b"dup.example:second", b":relay-default"])
    assert find_relay(table, b"a.example") == b"relay-a"
    assert find_relay(table, b"x.a.example") == b"relay-dot"          # '.example' beats the empty key
    assert find_relay(table, b"y.x.b.example") == b"relay-b"          # the longest suffix first
    assert find_relay(table, b"b.example") == b"relay-dot"            # '.b.example' needs the dot
    assert find_relay(table, b"exact.EXAMPLE") == b"relay-exact"      # keys are case-insensitive
    assert find_relay(table, b"noroute.example") is None              # empty relay = use MX
    assert find_relay(table, b"dup.example") == b"second"             # a later line wins
    assert find_relay(table, b"elsewhere.org") == b"relay-default"
    assert find_relay(route_table([]), b"elsewhere.org") is None


def test_relay_ports():
    assert split_relay(b"[127.0.0.1]:2525") == (b"[127.0.0.1]", 2525)
    assert split_relay(b"relay.example") == (b"relay.example", 25)
    assert split_relay(b"relay.example:26x") == (b"relay.example", 26)
    assert split_relay(b"relay.example:") == (b"relay.example", 0)


@pytest.mark.slow
def test_relay_is_used_even_for_local_addresses(qmail_home):
    """A relay skips the 'best MX but not in locals' rule: 127.0.0.1 is one of ours."""
    with Smtpd() as peer:
        qmail_home.control("smtproutes", "# comment line\n\n.route.test:[127.0.0.1]:%d\n" % peer.port)
        _, records = qmail_remote(qmail_home, "sub.route.test", b"a@b", b"u@sub.route.test")
    assert records[-1] == b"K127.0.0.1 accepted message.\nRemote host said: 250 2.0.0 Ok: queued\n"
    assert peer.transactions[0].rcpt_tos == ["u@sub.route.test"]
