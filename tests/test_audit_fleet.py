"""qmail-audit --fleet (issue 26 points 1 and 2): hand-offs between qmailpy homes linked into
journeys, and what only the fleet view catches (docs/architecture.md "The audit", qmail-audit(8)).

The end-to-end tests run a fleet of real homes (tests/fleet_support.py), each SMTP listener on its
own 127.0.1.x address, mail through smtproutes, and audit their logs and queues in one Spark
session for the module. The linking rule's corner cases (several candidates, a duplicate from a
deferred attempt, a loop, a journey ending nowhere) are checked on rows, without Spark.
"""
import json
import os
import subprocess

import pytest

from conftest import VENV_BIN
from ctl_support import ctl
from fleet_support import (FleetHost, free_port, kill_home, make_null_client, null_client_sendmail,
                           remove_queued, shifted_log, wait_file)
from lspawn_harness import LocalUsers
from smtpd_support import ListenerProcess
from qmailpy import logline
from qmailpy_audit import fleet

COUNT = 3
MSG = b"Subject: fleet %d\n\nhello\n"


# --- the linking rule on rows -------------------------------------------------------------

def _occ(host, n, birth, qp, size=100, sender="a@x.example", ended=True, bounced=0):
    return {"host": host, "n": n, "birth": birth, "bytes": size, "sender": sender, "qp": qp,
            "end_time": birth + 5 if ended else None, "ended": ended, "bounced": bounced,
            "triple": 0, "orphan": False}


def _dl(host, n, birth, start, done, result="k", channel="remote", reason=None, rcpt="r@far"):
    return {"host": host, "n": n, "occ_birth": birth, "result": result, "channel": channel,
            "recipient": rcpt, "dstart": start, "ddone": done, "reason": reason}


def _said(address, qp, when=1795000000):
    return "%s_accepted_message./Remote_host_said:_250_ok_%d_qp_%d/" % (address, when, qp)


MAP = {"10.0.0.1": "a", "10.0.0.2": "b"}


def test_handoff_reads_qmail_remote_success_text():
    assert fleet.handoff(_said("127.0.1.2", 4242)) == ("127.0.1.2", 1795000000, 4242)
    assert fleet.handoff("did_0+0+1/") is None


def test_map_naming_an_address_twice_is_an_error():
    with pytest.raises(fleet.MapError, match=r"MAP:3: address 10.0.0.2 named twice \(hosts b and c\)"):
        fleet.parse_map(["a 10.0.0.1", "b 10.0.0.2 # hub", "c 10.0.0.3 10.0.0.2"])
    assert fleet.parse_map(["# fleet", "", "a 10.0.0.1 ::1"]) == {"10.0.0.1": "a", "::1": "a"}


def test_same_qp_twice_links_nearest_in_time_and_counts_ambiguity():
    """One worker (qp 7) queued both of b's messages: each hand-off gets the one nearest
    to its 250, none is merged, both are counted as having had two candidates."""
    occs = [_occ("a", 1, 0.0, 1), _occ("a", 2, 10.0, 1),
            _occ("b", 11, 1.0, 7, size=150), _occ("b", 12, 11.0, 7, size=150)]
    dls = [_dl("a", 1, 0.0, 0.5, 1.5, reason=_said("10.0.0.2", 7)),
           _dl("a", 2, 10.0, 10.5, 11.5, reason=_said("10.0.0.2", 7)),
           _dl("b", 11, 1.0, 2, 3, channel="local"), _dl("b", 12, 11.0, 12, 13, channel="local")]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    routes = {(j["origin_n"], tuple(h["n"] for h in j["hops"])) for j in f.journeys}
    assert routes == {(1, (1, 11)), (2, (2, 12))}
    assert f.ambiguous == 2 and f.findings == []
    assert all(j["ended"] == "delivered" for j in f.journeys)


def test_copy_queued_during_a_deferred_attempt_is_a_duplicate_not_a_hop():
    occs = [_occ("a", 1, 0.0, 1), _occ("b", 11, 1.0, 7, size=120),
            _occ("b", 12, 60.0, 8, size=120)]
    dls = [_dl("a", 1, 0.0, 0.5, 30.0, result="z", reason="Connection_died./"),
           _dl("a", 1, 0.0, 59.5, 60.5, reason=_said("10.0.0.2", 8)),
           _dl("b", 11, 1.0, 2, 3, channel="local"), _dl("b", 12, 60.0, 61, 62, channel="local")]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    assert [(x[0], x[1], x[3], x[4]) for x in f.findings] == \
        [("b", 11, "duplicate-across-hosts", "notice")]
    assert "message 11 and message 12" in f.findings[0][6]
    assert len(f.journeys) == 1 and f.journeys[0]["route"] == "a>b"


def test_loop_and_journey_ending_nowhere():
    occs = [_occ("a", 1, 0.0, 1), _occ("b", 11, 1.0, 7), _occ("a", 2, 2.0, 9)]
    dls = [_dl("a", 1, 0.0, 0.5, 1.5, reason=_said("10.0.0.2", 7)),
           _dl("b", 11, 1.0, 1.5, 2.5, reason=_said("10.0.0.1", 9))]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    kinds = sorted(x[3] for x in f.findings)
    assert kinds == ["loop", "vanished-in-fleet"]
    assert f.journeys[0]["route"] == "a>b>a" and f.journeys[0]["loop"]


def test_two_hand_offs_of_one_message_to_one_peer_are_branches_not_a_loop():
    """Two recipients at one peer: qmail-remote runs once for each, the peer queues two
    messages. The journey has two branches at b, and no host twice on a path."""
    occs = [_occ("a", 1, 0.0, 1), _occ("b", 11, 1.0, 7, size=150),
            _occ("b", 12, 1.2, 8, size=150)]
    dls = [_dl("a", 1, 0.0, 0.5, 1.1, reason=_said("10.0.0.2", 7), rcpt="x@far"),
           _dl("a", 1, 0.0, 0.6, 1.3, reason=_said("10.0.0.2", 8), rcpt="y@far"),
           _dl("b", 11, 1.0, 2, 3, channel="local"), _dl("b", 12, 1.2, 2, 3, channel="local")]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    assert f.findings == []
    assert [(j["route"], j["loop"], j["ended"]) for j in f.journeys] == \
        [("a>b>b", False, "delivered")]


def test_a_spare_message_of_another_size_or_queued_after_the_copy_is_no_duplicate():
    """A message of the same sender that b queued during a's deferred attempt, but of
    another size than the copy linked to the hand-off, is b's own: not a duplicate; so is
    one of the same size queued after the linked copy (a copy comes from an earlier attempt),
    or over 2 s before the deferred attempt began."""
    occs = [_occ("a", 1, 0.0, 1), _occ("b", 11, 1.0, 7, size=3000),
            _occ("b", 12, 60.0, 8, size=120), _occ("b", 13, 61.0, 9, size=120),
            _occ("b", 14, -3.0, 5, size=120)]
    dls = [_dl("a", 1, 0.0, 0.5, 30.0, result="z", reason="Connection_died./"),
           _dl("a", 1, 0.0, 59.5, 60.5, reason=_said("10.0.0.2", 8)),
           _dl("b", 11, 1.0, 2, 3, channel="local"), _dl("b", 12, 60.0, 61, 62, channel="local"),
           _dl("b", 13, 61.0, 62, 63, channel="local"), _dl("b", 14, -3.0, -2, -1, channel="local")]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    assert f.findings == []
    assert sorted(j["route"] for j in f.journeys) == ["a>b", "b", "b", "b"]


def test_latency_is_corrected_by_the_pairs_observed_skew():
    """b's clock runs 240 s behind a's: the skew of (a, b) is about -240 s, and the hop's
    latency and the end-to-end latency are on a's clock (seconds, not -4 minutes)."""
    occs = [_occ("a", n, 100.0 * n, n) for n in (1, 2, 3)]
    occs += [_occ("b", 10 + n, 100.0 * n + 2.0 - 240, 50 + n, size=150) for n in (1, 2, 3)]
    dls = [_dl("a", n, 100.0 * n, 100.0 * n + 1.5, 100.0 * n + 2.1,
               reason=_said("10.0.0.2", 50 + n)) for n in (1, 2, 3)]
    dls += [_dl("b", 10 + n, 100.0 * n + 2.0 - 240, 0, 100.0 * n + 5.0 - 240, channel="local")
            for n in (1, 2, 3)]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    assert f.findings == []
    (skew,) = f.skew_by_pair()
    assert skew["median"] == pytest.approx(-240.1)
    for j in f.journeys:
        assert j["route"] == "a>b"
        assert j["hops"][1]["latency"] == pytest.approx(2.1)      # 2.0 s, less the 0.1 s bias
        assert j["end_to_end"] == pytest.approx(5.1)
    (pair,) = f.summary()["latency_by_pair"]
    assert (pair["src"], pair["dst"], pair["hops"]) == ("a", "b", 3)
    assert pair["p50"] == pytest.approx(2.1)


def test_qmqp_hand_off_from_a_null_client_starts_the_journey_there():
    """b's qmail-qmqpd logged `qmqp from 10.0.0.9 qp 7` at 10.2: the message b queued with qp 7
    nearest that time came from the null client mini; the other qp-7 message (a local
    submission served by the same worker) did not. qmail-qmqpd logs its line after
    qmail-queue returns: b had queued the message at 10.0 and delivered it by 10.1, so the
    journey took 0.1 s, not -0.1 s."""
    address_map = dict(MAP, **{"10.0.0.9": "mini"})
    occs = [_occ("b", 11, 10.0, 7), _occ("b", 12, 50.0, 7)]
    dls = [_dl("b", 11, 10.0, 10.05, 10.1, channel="local"),
           _dl("b", 12, 50.0, 51, 52, channel="local")]
    f = fleet.Fleet(address_map, occs, dls, {"b"}, {"b"}, qmqp_rows=[("b", 10.2, "10.0.0.9", 7)])
    assert f.findings == []
    journeys = sorted(f.journeys, key=lambda j: j["route"])
    assert [j["route"] for j in journeys] == ["b", "mini>b"]
    mini = journeys[1]
    assert (mini["origin_host"], mini["origin_n"], mini["origin_birth"]) == ("mini", None, 10.2)
    assert mini["hops"][0] == {"host": "mini", "n": None, "queued": None, "left": 10.2,
                               "latency": None}
    assert mini["hops"][1]["latency"] == pytest.approx(-0.2)
    assert mini["end_to_end"] == pytest.approx(10.1 - 10.0)
    assert f.summary()["qmqp"] == {"received": 1, "linked": 1, "from_null_clients": 1}
    # a client MAP does not name is still where the journey began, named by its address
    f = fleet.Fleet(MAP, occs, dls, {"b"}, {"b"}, qmqp_rows=[("b", 10.2, "10.0.0.9", 7)])
    assert sorted(j["route"] for j in f.journeys) == ["b", "qmqp:10.0.0.9>b"]
    assert f.summary()["qmqp"] == {"received": 1, "linked": 1, "from_null_clients": 0}


def test_a_hand_off_to_an_address_not_in_the_map_ends_outside():
    occs = [_occ("a", 1, 0.0, 1), _occ("b", 11, 1.0, 7)]
    dls = [_dl("a", 1, 0.0, 0.5, 1.5, reason=_said("10.0.0.2", 7)),
           _dl("b", 11, 1.0, 2.0, 4.0, reason=_said("192.0.2.25", 99))]
    f = fleet.Fleet(MAP, occs, dls, {"a", "b"}, {"a", "b"})
    assert f.findings == [] and f.unjudged == 0
    (j,) = f.journeys
    assert (j["route"], j["ended"], j["ended_where"]) == ("a>b", "outside", ["outside at b>192.0.2.25"])
    # b queued it 0.5 s before a's delivery ended: its clock counts as 0.5 s behind a's
    assert j["end_to_end"] == pytest.approx(4.5)


def test_discarded_double_bounce_and_log_begun_inside_are_ends_not_vanished():
    """qmail-send discards a double bounce (triple bounce) by design; a message whose log
    began inside had its deliveries before the log: neither ended nowhere."""
    triple = dict(_occ("a", 1, 0.0, 1), triple=1)
    orphan = dict(_occ("a", 2, 5.0, 2), orphan=True)
    f = fleet.Fleet(MAP, [triple, orphan], [], {"a"}, {"a"})
    assert f.findings == []
    assert sorted(j["ended"] for j in f.journeys) == ["before-log", "discarded"]


def test_command_refuses_a_map_naming_an_address_twice(tmp_path):
    bad = tmp_path / "fleet.map"
    bad.write_text("mx 127.0.1.2\nhub 127.0.1.3 127.0.1.2\n")
    done = subprocess.run([os.path.join(VENV_BIN, "qmail-audit"), "--fleet", str(bad), "--out", str(tmp_path / "out"),
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "fleet.map:2: address 127.0.1.2 named twice (hosts mx and hub)" in done.stderr
    assert not (tmp_path / "out").exists()



def test_command_without_pyarrow_says_so_before_starting_spark(tmp_path):
    """pyarrow (the spark extra's, which collects the fleet's rows) missing: a clear error,
    exit 2, nothing written; not a traceback after minutes of auditing."""
    code = ("import sys; sys.modules['pyarrow'] = None; "
            "from qmailpy.cli.qmail_audit import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([os.path.join(VENV_BIN, "python"), "-c", code, "--out",
                           str(tmp_path / "out"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("qmail-audit: pyarrow is not installed "
                           "(pip install 'qmailpy[spark]')\n")
    assert not (tmp_path / "out").exists()


# --- a real fleet ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    from qmailpy.cli.qmail_audit import session
    s = session("local[2]", "qmail-audit-fleet-tests")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def real_fleet():
    """relay (127.0.1.1) -> mx (127.0.1.2) -> hub (127.0.1.3), COUNT messages for far.example,
    which the hub defers (its route leads nowhere): still queued there. And one message the
    relay hands to gone (127.0.1.4), whose queue loses it behind qmail-send's back after its
    250 (qmail-send was not running). And a null client, mini (qmailctl init --mini, no queue
    and no log, connecting from 127.0.0.1), that hands the hub's qmail-qmqpd two messages by
    QMQP: one for the hub's user bench (delivered there), one for far.example (queued)."""
    hosts = [FleetHost("relay", "127.0.1.1"), FleetHost("mx", "127.0.1.2"),
             FleetHost("hub", "127.0.1.3"), FleetHost("gone", "127.0.1.4")]
    relay, mx, hub, gone = hosts
    try:
        hub.accept_for("far.example")
        hub.routes("far.example:127.0.0.1:%d\n" % free_port("127.0.0.1"))
        mx.accept_for("far.example")
        mx.routes("far.example:[127.0.1.3]:%d\n" % hub.port)
        gone.accept_for("lost.example")
        hub.home.control("qmqpclients", "127.0.0.1:allow\n")
        LocalUsers(hub.home).add("bench")
        gone.start(smtp=False)          # a log of its own, then down
        gone.stop()
        for h in (hub, mx, relay):
            h.start(qmqp=h is hub)
        mini = make_null_client(relay.base, "%s:%d" % (hub.address, hub.qmqp_port))
        null_client_sendmail(mini, MSG % 50, "cron@mini.example", "bench@test.example")
        null_client_sendmail(mini, MSG % 51, "cron@mini.example", "q@far.example")
        with ListenerProcess(gone.home, address=gone.address) as listener:
            relay.routes("far.example:[127.0.1.2]:%d\nlost.example:[127.0.1.4]:%d\n"
                         % (mx.port, listener.port))
            for i in range(COUNT):
                done = relay.home.queue_message(MSG % i, b"a@test.example",
                                                [b"r%d@far.example" % i])
                assert done.returncode == 0, done.stderr
            done = relay.home.queue_message(MSG % 99, b"a@test.example", [b"x@lost.example"])
            assert done.returncode == 0, done.stderr
            relay.wait_log(lambda text: "success: 127.0.1.4_accepted_message." in text)
            assert remove_queued(gone.home)
        hub.wait_log(lambda text: text.count(": deferral: ") >= COUNT + 1
                     and ": success: did_" in text)
        for h in (relay, mx, hub):
            h.stop()
        yield hosts
    finally:
        for h in hosts:
            ctl(h.home, "stop")         # whatever an assertion left running
            h.remove()


def _fleet_audit(spark, inputs, host_map, out, skew=fleet.DEFAULT_SKEW):
    from qmailpy_audit import job
    addresses = {"127.0.1.1": "relay", "127.0.1.2": "mx", "127.0.1.3": "hub", "127.0.1.4": "gone",
                 "127.0.0.1": "mini"}
    opts = job.Options(host_map=[(os.path.abspath(p), n) for p, n in host_map],
                       fleet_map=addresses, skew=skew)
    return job.audit(spark, inputs, str(out), opts)


@pytest.mark.slow
def test_synthetic_fleet_gives_exactly_the_findings_it_expects(spark, tmp_path):
    """synthetic.generate_fleet (bench/audit.py --hosts) hands some remote successes of each
    host to the next, sometimes two of one message to one peer, some after a deferral: the
    audit finds what its expectations say (no finding) and links every hand-off."""
    from qmailpy_audit import job, synthetic
    text, expects = synthetic.generate_fleet(str(tmp_path / "fleet"), hosts=3, messages=300,
                                             seed=3)
    hosts = [str(tmp_path / "fleet" / ("h%d" % i)) for i in range(1, 4)]
    result = job.audit(spark, hosts, str(tmp_path / "out"),
                       job.Options(fleet_map=fleet.parse_map(text.splitlines()),
                                   write_parquet=False))
    expected = {}
    for e in expects:
        for kind, count in e.findings.items():
            expected[kind] = expected.get(kind, 0) + count
    assert result.findings_by_kind == expected
    handed = sum(len(e.handoffs) for e in expects)
    fl = result.summary["fleet"]
    assert handed > 50 and fl["handoffs"] == fl["linked"] == handed
    assert fl["ambiguous"] == 0 and fl["across_hosts"] > 0


def _journeys(spark, out):
    return [r.asDict(recursive=True) for r in
            spark.read.parquet(str(out / "journeys.parquet")).collect()]


@pytest.mark.slow
def test_fleet_links_every_journey_and_finds_the_lost_hand_off(spark, real_fleet, tmp_path):
    homes = [h.home.path for h in real_fleet]
    result = _fleet_audit(spark, homes, [(h.home.path, h.name) for h in real_fleet],
                          tmp_path / "out")
    assert result.bad_inputs == []
    fl = result.summary["fleet"]
    journeys = _journeys(spark, tmp_path / "out")
    through = [j for j in journeys if j["route"] == "relay>mx>hub"]
    assert len(through) == COUNT, journeys
    for j in through:
        assert [h["host"] for h in j["hops"]] == ["relay", "mx", "hub"]
        assert j["ended"] == "queued" and j["ended_where"] == ["queued at hub"]
        assert j["hops"][0]["left"] is not None and j["hops"][2]["left"] is None
        # one machine's clock: each hop took seconds at most, none is negative
        assert j["hops"][0]["latency"] is None
        assert all(0 <= h["latency"] < 30 for h in j["hops"][1:]), j
    assert fl["handoffs"] == 2 * COUNT + 1 and fl["linked"] == 2 * COUNT
    assert result.findings_by_kind["lost-between-hosts"] == 1
    assert "vanished-in-fleet" not in result.findings_by_kind
    lost = [f for f in result.summary["findings"]["violation_examples"]
            if f["kind"] == "lost-between-hosts"]
    assert lost[0]["host"] == "relay" and "gone never queued it" in lost[0]["detail"]
    assert [j["ended"] for j in journeys if j["route"] == "relay"] == ["lost"]
    assert result.exit_code == 1
    pairs = {(s["src"], s["dst"]): s for s in fl["skew"]}
    assert set(pairs) == {("relay", "mx"), ("mx", "hub")}
    assert all(abs(s["median"]) < 5 for s in pairs.values())
    with open(tmp_path / "out" / "summaries.json") as f:
        assert json.load(f)["fleet"]["journeys"] == len(journeys)
    with open(tmp_path / "out" / "report.html", encoding="utf-8") as f:
        html = f.read()
    assert "Fleet: journeys across hosts" in html and "relay&gt;mx&gt;hub" in html
    # the null client's hand-offs, linked from the hub's side: qmail-qmqpd's lines name the
    # client and the qp that the hub's qmail-send logged for the message
    relay, mx, hub, gone = real_fleet
    with open(hub.qmqpd_log, encoding="utf-8") as f:
        received = [r for r in map(logline.parse_qmqp_from, f) if r is not None]
    assert [r[1] for r in received] == ["127.0.0.1"] * 2
    infos = {e.fields["n"]: e.fields["qp"] for e in map(logline.parse, hub.log_text().splitlines())
             if e.kind == "info msg"}
    from_mini = sorted((j for j in journeys if j["route"] == "mini>hub"), key=lambda j: j["ended"])
    assert [j["ended"] for j in from_mini] == ["delivered", "queued"], journeys
    assert sorted(infos[j["hops"][1]["n"]] for j in from_mini) == sorted(r[2] for r in received)
    for j in from_mini:
        assert (j["origin_host"], j["origin_n"]) == ("mini", None)
        assert j["hops"][0] == {"host": "mini", "n": None, "queued": None,
                                "left": j["origin_birth"], "latency": None}
        assert j["origin_birth"] in [r[0] for r in received]
        assert 0 <= j["hops"][1]["latency"] + fleet.QMQP_BEFORE < 30
    assert 0 <= from_mini[0]["end_to_end"] < 60 and from_mini[1]["end_to_end"] is None
    assert fl["qmqp"] == {"received": 2, "linked": 2, "from_null_clients": 2}
    assert not [w for w in result.warnings if "mini" in w]     # a null client has no input
    assert {(p["src"], p["dst"]) for p in fl["latency_by_pair"]} == \
        {("relay", "mx"), ("mx", "hub"), ("mini", "hub")}
    # the route that ended (delivered) has its percentiles and its bar in the plot
    (route,) = [r for r in fl["latency_by_route"] if r["route"] == "mini>hub"]
    assert (route["journeys"], route["ended"]) == (2, 1) and route["p50"] == route["max"]
    assert "End-to-end latency by route (seconds)" in html and "mini&gt;hub" in html
    assert "Hop latency per pair of hosts" in html and "QMQP hand-offs linked" in html


@pytest.mark.slow
def test_hub_log_four_minutes_behind_still_links_and_its_skew_is_reported(spark, real_fleet,
                                                                          tmp_path):
    from qmailpy import snapshot_format
    from qmailpy.backends import snapshot as home_snapshot
    relay, mx, hub, _gone = real_fleet
    copy = tmp_path / "hub"
    copy.mkdir()
    shifted_log(hub.log, copy / "qmail-send.log", -240)
    with open(copy / "queue.snapshot", "w", encoding="utf-8") as out:
        snapshot_format.write(home_snapshot.walk(hub.home.path, host="hub"), out)
    inputs = [relay.home.path, mx.home.path, str(copy)]
    host_map = [(relay.home.path, "relay"), (mx.home.path, "mx"), (str(copy), "hub")]
    result = _fleet_audit(spark, inputs, host_map, tmp_path / "out")
    fl = result.summary["fleet"]
    assert fl["linked"] == 2 * COUNT and fl["unjudged"] == 1        # gone: no input
    skew = {(s["src"], s["dst"]): s for s in fl["skew"]}[("mx", "hub")]
    assert -245 < skew["median"] < -235, skew
    assert "lost-between-hosts" not in result.findings_by_kind
    journeys = _journeys(spark, tmp_path / "out")
    through = [j for j in journeys if j["route"] == "relay>mx>hub"]
    assert len(through) == COUNT
    for j in through:
        mx_hop, hub_hop = j["hops"][1], j["hops"][2]
        assert hub_hop["queued"] - mx_hop["queued"] < -200       # the hub's own clock
        # on the relay's clock: seconds at most (a hop's own delay varies around the median
        # the skew is taken from, so it may come out a fraction of a second below zero)
        assert -5 < hub_hop["latency"] < 30, j
    (pair,) = [p for p in fl["latency_by_pair"] if (p["src"], p["dst"]) == ("mx", "hub")]
    assert -5 < pair["p50"] < 30 and pair["hops"] == COUNT
    # with a tolerance under the skew the same hand-offs are not linked: lost
    tight = _fleet_audit(spark, inputs, host_map, tmp_path / "tight", skew=60)
    assert tight.findings_by_kind["lost-between-hosts"] == COUNT


# the hub's qmail-smtpd queues through this: once qmail-queue has committed the message it says
# so (READY holds its pid) and waits, so the hub can be SIGKILLed between its commit and its 250
QUEUE_THEN_WAIT = """#!/bin/sh
%(qmail_queue)s
echo $$ > %(ready)s.tmp && mv %(ready)s.tmp %(ready)s
exec sleep 600
"""


def _each_message_deferred(log_text, copies):
    """Whether qmail-send's log shows `copies` messages queued and an attempt of each deferred
    (delivery numbers start again at 1 when qmail-send restarts: each is read in its run)."""
    queued, deferred, attempt_of = [], set(), {}
    for event in map(logline.parse, log_text.splitlines()):
        if event.kind == "new msg":
            queued.append(event.fields["n"])
        elif event.kind == "starting delivery":
            attempt_of[event.fields["d"]] = event.fields["n"]
        elif event.kind == "delivery" and event.fields["result"] == "deferral":
            deferred.add(attempt_of.get(event.fields["d"]))
    return len(queued) >= copies and deferred.issuperset(queued)


@pytest.fixture(scope="module")
def killed_hub_fleet():
    """mx (127.0.1.2) hands one message for far.example to hub (127.0.1.3), which defers it
    (its route leads nowhere). The hub is SIGKILLed (every process of its home) after its
    queue committed the message and before its 250: mx logs a deferral for a message the hub
    holds. The hub starts again, mx retries (qmailctl doqueue) and the hub queues it again."""
    mx, hub = FleetHost("mx", "127.0.1.2"), FleetHost("hub", "127.0.1.3")
    try:
        hub.accept_for("far.example")
        hub.routes("far.example:127.0.0.1:%d\n" % free_port("127.0.0.1"))
        mx.routes("far.example:[127.0.1.3]:%d\n" % hub.port)
        signals = os.path.join(hub.base, "signals")     # the hub's qmail-smtpd writes here
        os.mkdir(signals)
        os.chmod(signals, 0o1777)
        ready = os.path.join(signals, "committed")
        wrapper = os.path.join(hub.base, "queue-then-wait")
        with open(wrapper, "w") as f:
            f.write(QUEUE_THEN_WAIT % {"qmail_queue": os.path.join(VENV_BIN, "qmail-queue"),
                                       "ready": ready})
        os.chmod(wrapper, 0o755)
        done = hub.home.run(["qmailctl", "start", "--home", hub.home.path, "--smtp",
                             "%s:%d" % (hub.address, hub.port)],
                            env=dict(hub.home.env, QMAILQUEUE=wrapper))
        assert done.returncode == 0, done.stderr
        mx.start(smtp=False)
        done = mx.home.queue_message(MSG % 7, b"a@test.example", [b"r@far.example"])
        assert done.returncode == 0, done.stderr
        wait_file(ready)
        # the hub's own attempt for its first copy is on disk before the kill: the kill may
        # otherwise take the line with the logger after qmail-send has set the copy's retry,
        # and then no second attempt comes after the restart
        hub.wait_log(lambda text: ": deferral: " in text)
        kill_home(hub.home.path)
        mx.wait_log(lambda text: ": deferral: " in text)
        hub.start()
        assert ctl(mx.home, "doqueue").returncode == 0
        mx.wait_log(lambda text: ": success: 127.0.1.3_accepted_message." in text)
        hub.wait_log(lambda text: _each_message_deferred(text, copies=2))
        for h in (mx, hub):
            h.stop()
        yield mx, hub
    finally:
        for h in (mx, hub):
            kill_home(h.home.path, required=False)     # whatever an assertion left running
            h.remove()


@pytest.mark.slow
def test_hub_killed_between_commit_and_250_is_a_duplicate_not_a_loss(spark, killed_hub_fleet,
                                                                     tmp_path):
    mx, hub = killed_hub_fleet
    result = _fleet_audit(spark, [mx.home.path, hub.home.path],
                          [(mx.home.path, "mx"), (hub.home.path, "hub")], tmp_path / "out")
    assert result.bad_inputs == []
    assert result.findings_by_kind.get("duplicate-across-hosts") == 1
    assert "lost-between-hosts" not in result.findings_by_kind
    assert "vanished-in-fleet" not in result.findings_by_kind
    assert result.violations == 0, result.summary["findings"]["violation_examples"]
    queued = result.summary["fleet_queue"]["hosts"]
    assert [(h["host"], h["messages"]) for h in queued] == [("hub", 2), ("mx", 0)]
    journeys = _journeys(spark, tmp_path / "out")
    assert [(j["route"], j["ended"]) for j in journeys] == [("mx>hub", "queued")]
    copy = journeys[0]["hops"][1]["n"]
    findings = spark.read.parquet(str(tmp_path / "out" / "findings.parquet")) \
        .filter("kind = 'duplicate-across-hosts'").collect()
    assert findings[0]["host"] == "hub" and findings[0]["severity"] == "notice"
    assert findings[0]["detail"] == (
        "hub queued message %d and message %d for one hand-off from mx message %d (an attempt "
        "it logged as deferred)" % (findings[0]["n"], copy, journeys[0]["origin_n"]))
