"""The fleet's queue and `qmail-audit --where` (issue 26 point 3), a routing loop and a host
with a log but no snapshot, on a fleet of real qmailpy homes (tests/fleet_support.py).

One fleet for the module: relay (127.0.1.1) -> mx (127.0.1.2) -> hub (127.0.1.3). Mail stays
queued on every host, each at a peer that does not listen: COUNT messages for far.example at
the hub, two for stuck.example at the relay, one for two domains at the mx. One message for
loop.example goes round relay -> mx -> relay (smtproutes that loop) until qmail-smtpd refuses
it for too many hops; its bounce stays queued at the relay. Every host's
queue is then snapshotted with `qmailctl snapshot`, and the snapshots and logs audited.
"""
import json
import os
import subprocess

import pytest

from conftest import VENV_BIN
from ctl_support import ctl
from fleet_support import FleetHost, free_port
from qmailpy import snapshot_format
from qmailpy.smtpd.data import MAX_HOPS
from qmailpy_audit import where as where_mod

COUNT = 3
MAP = "relay 127.0.1.1\nmx 127.0.1.2\nhub 127.0.1.3\n"
ADDRESSES = {"127.0.1.1": "relay", "127.0.1.2": "mx", "127.0.1.3": "hub"}
# the loop message starts with this many Received: lines; qmail-queue adds one at every queueing
# and qmail-smtpd one at every hop: it is queued with 97, reaches the relay again with 101, and
# the mx refuses the third hop
LOOP_RECEIVED = MAX_HOPS - 4


def _record(sender, recipients, message_id=None, state="S5", birth=1000.0, size=100):
    return snapshot_format.message_record(
        "mx", 7, "log", {}, sender, [snapshot_format.recipient("remote", a, done)
                                     for a, done in recipients],
        state=state, birth=birth, size=size, message_id=message_id)


def test_where_matches_sender_recipient_and_message_id_as_an_administrator_types_them():
    rec = _record("Joe@A.example", [("you@There.example", True), ("him@there.example", False)],
                  "<x.1@a.example>")
    bounce = _record("", [("joe@a.example", False)])

    def matches(query):
        return [r is rec for r in (rec, bounce) if where_mod.matcher(*where_mod.parse(query))(r)]
    assert matches("sender=joe@a.example") == [True]
    assert matches("sender=<>") == [False] and matches("sender=") == [False]
    assert matches("recipient=YOU@there.example") == [True]     # delivered: still its recipient
    assert matches("recipient=joe@a.example") == [False]
    assert matches("message-id=x.1@a.example") == [True]
    assert matches("Message-ID=<x.1@a.example>") == [True]
    assert matches("message-id=<X.1@a.example>") == []          # a Message-ID is exact
    for bad in ("subject=hi", "sender", "message-id=<>", "recipient="):
        with pytest.raises(ValueError):
            where_mod.parse(bad)


def test_fleet_queue_counts_a_message_once_per_pending_domain():
    fleetqueue = pytest.importorskip("qmailpy_audit.fleetqueue")
    rec = _record("a@x", [("u@one.example", False), ("v@one.example", False),
                          ("w@Two.example", False), ("done@three.example", True)], birth=1000.0)
    assert sorted(fleetqueue.table_items(rec, 1000.0 + 7200)) == [
        (("mx", "one.example", "1h-6h", "S5"), (1, 2, 100)),
        (("mx", "two.example", "1h-6h", "S5"), (1, 1, 100))]
    assert fleetqueue.message_items(rec, 1000.0 + 7200) == (("mx", "S5", "1h-6h"), (1, 3, 100))
    leftover = _record(None, [], state="S2", birth=None)
    assert fleetqueue.table_items(leftover, 5.0) == [(("mx", None, "unknown", "S2"), (1, 0, 100))]
    assert [fleetqueue.age_bucket(a) for a in (0, 299.9, 300, 7 * 86400)] == \
        ["0-5m", "0-5m", "5m-1h", "7d+"]


def _queue(host, message, sender, recipients):
    done = host.home.queue_message(message, sender, recipients)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    """{name: FleetHost} after the mail above, stopped; BASE/snaps/NAME/queue.snapshot."""
    base = tmp_path_factory.mktemp("fleetqueue")
    hosts = {h.name: h for h in (FleetHost("relay", "127.0.1.1"), FleetHost("mx", "127.0.1.2"),
                                 FleetHost("hub", "127.0.1.3"))}
    relay, mx, hub = hosts["relay"], hosts["mx"], hosts["hub"]
    dead = free_port("127.0.0.1")
    try:
        hub.accept_for("far.example")
        hub.routes("far.example:127.0.0.1:%d\n" % dead)
        mx.accept_for("far.example", "loop.example")
        mx.routes("far.example:[127.0.1.3]:%d\nloop.example:[127.0.1.1]:%d\n"
                  "mxstuck.example:127.0.0.1:%d\nother.example:127.0.0.1:%d\n"
                  % (hub.port, relay.port, dead, dead))
        relay.accept_for("loop.example")
        relay.routes("far.example:[127.0.1.2]:%d\nloop.example:[127.0.1.2]:%d\n"
                     "stuck.example:127.0.0.1:%d\n" % (mx.port, mx.port, dead))
        for h in (hub, mx, relay):
            h.start()
        for i in range(COUNT):
            _queue(relay, b"Message-ID: <far-%d@test.example>\nSubject: far %d\n\nhi\n" % (i, i),
                   b"a@test.example", [b"r%d@far.example" % i])
        for i in range(2):
            _queue(relay, b"Message-ID: <stuck-%d@test.example>\n\nstuck\n" % i,
                   b"b@test.example", [b"s%d@stuck.example" % i])
        _queue(mx, b"Message-ID:\n <mx-0@test.example>\n\nboth\n", b"c@test.example",
               [b"u@mxstuck.example", b"v@other.example"])
        _queue(relay, b"Received: x\n" * LOOP_RECEIVED + b"Subject: loop\n\nround\n",
               b"loop@stuck.example", [b"l@loop.example"])
        hub.wait_log(lambda text: text.count(": deferral: ") >= COUNT)
        mx.wait_log(lambda text: text.count(": deferral: ") >= 2)
        # the two stuck.example messages and the loop's bounce, deferred
        relay.wait_log(lambda text: ": failure: " in text and text.count(": deferral: ") >= 3)
        for h in hosts.values():
            h.stop()
            snaps = base / "snaps" / h.name
            snaps.mkdir(parents=True)
            done = ctl(h.home, "snapshot", "--host", h.name, "--out", str(snaps / "queue.snapshot"))
            assert done.returncode == 0, done.stderr
        (base / "fleet.map").write_text(MAP)
        yield base, hosts
    finally:
        for h in hosts.values():
            ctl(h.home, "stop")         # whatever an assertion left running
            h.remove()


def _snapshot(base, name):
    with open(base / "snaps" / name / "queue.snapshot", encoding="utf-8") as f:
        records, errors = snapshot_format.read(f)
    assert errors == []
    return [r for r in records if r["record"] == "message"]


def _inputs(base, hosts, names_with_snapshot=("relay", "mx", "hub")):
    """(inputs, host map): the snapshots named and every host's qmail-send log."""
    inputs = [str(base / "snaps" / n / "queue.snapshot") for n in names_with_snapshot]
    host_map = [(str(base / "snaps" / n), n) for n in names_with_snapshot]
    for h in hosts.values():
        inputs.append("log:" + h.log)
        host_map.append((h.log, h.name))
    return inputs, host_map


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    from qmailpy.cli.qmail_audit import session
    s = session("local[2]", "qmail-audit-fleet-queue-tests")
    yield s
    s.stop()


def _audit(spark, base, hosts, out, where=None, **kw):
    from qmailpy_audit import job
    inputs, host_map = _inputs(base, hosts, **kw)
    opts = job.Options(host_map=[(os.path.abspath(p), n) for p, n in host_map],
                       fleet_map=ADDRESSES)
    opts.where = where
    return job.audit(spark, inputs, str(out), opts)


@pytest.fixture(scope="module")
def audited(spark, fleet_dir):
    base, hosts = fleet_dir
    out = base / "out"
    return _audit(spark, base, hosts, out, where=("sender", "loop@stuck.example")), out


@pytest.mark.slow
def test_fleet_queue_counts_what_is_queued_where(spark, fleet_dir, audited):
    base, _hosts = fleet_dir
    result, out = audited
    snaps = {n: _snapshot(base, n) for n in ("relay", "mx", "hub")}
    size = {n: {r["n"]: r["size"] for r in recs} for n, recs in snaps.items()}
    bounce = [r for r in snaps["relay"] if r["sender"] == ""]
    assert len(bounce) == 1 and bounce[0]["recipients"] == [
        {"channel": "remote", "address": "loop@stuck.example", "done": False}]
    rows = sorted(tuple(r) for r in spark.read.parquet(str(out / "fleet_queue.parquet"))
                  .select("host", "domain", "age", "state", "messages", "recipients", "bytes")
                  .collect())
    assert rows == [
        ("hub", "far.example", "0-5m", "S5", COUNT, COUNT, sum(size["hub"].values())),
        ("mx", "mxstuck.example", "0-5m", "S5", 1, 1, sum(size["mx"].values())),
        ("mx", "other.example", "0-5m", "S5", 1, 1, sum(size["mx"].values())),
        ("relay", "stuck.example", "0-5m", "S5", 3, 3, sum(size["relay"].values())),
    ]
    with open(out / "summaries.json") as f:
        fq = json.load(f)["fleet_queue"]
    assert [(h["host"], h["messages"], h["recipients"]) for h in fq["hosts"]] == \
        [("hub", COUNT, COUNT), ("mx", 1, 2), ("relay", 3, 3)]
    assert fq["messages"] == COUNT + 4 and fq["table_rows"] == 4
    assert fq["by_state"] == {"S5": COUNT + 4} and fq["by_age"] == {"0-5m": COUNT + 4}
    everything = sorted((n, r["n"], r["birth"]) for n, recs in snaps.items() for r in recs)
    assert [(e["host"], e["n"], e["birth"]) for e in fq["oldest"]] == \
        sorted(everything, key=lambda e: (e[2], e[0], e[1]))
    with open(out / "report.html", encoding="utf-8") as f:
        html = f.read()
    assert "Fleet queue: what is queued where" in html and "mxstuck.example" in html


@pytest.mark.slow
def test_a_loop_through_smtproutes_is_one_loop_finding(spark, audited):
    result, out = audited
    journeys = [r.asDict(recursive=True)
                for r in spark.read.parquet(str(out / "journeys.parquet")).collect()]
    looped = [j for j in journeys if j["loop"]]
    assert len(looped) == 1
    assert looped[0]["route"] == "relay>mx>relay"
    assert looped[0]["ended"] == "bounced" and looped[0]["ended_where"] == ["bounced at relay"]
    assert result.findings_by_kind["loop"] == 1
    assert "lost-between-hosts" not in result.findings_by_kind
    assert "vanished-in-fleet" not in result.findings_by_kind
    example = [f for f in result.summary["findings"]["violation_examples"] if f["kind"] == "loop"]
    assert example[0]["detail"] == "journey from relay message %d passes relay twice" \
        % looped[0]["origin_n"]


@pytest.mark.slow
def test_where_finds_a_message_gone_from_every_queue_by_its_sender_in_the_logs(audited):
    """The loop message is queued nowhere now; its journey is found from the logs."""
    result, _out = audited
    where = result.where
    assert where["query"] == {"sender": "loop@stuck.example"}
    assert where["queued"] == []
    assert [j["route"] for j in where["journeys"]] == ["relay>mx>relay"]
    assert set(where["snapshots"]) == {"relay", "mx", "hub"}


def _where(base, hosts, query, out):
    inputs, host_map = _inputs(base, hosts)
    args = [os.path.join(VENV_BIN, "qmail-audit"), "--master", "local[2]", "--fleet",
            str(base / "fleet.map"), "--where", query, "--out", str(out), "--no-parquet"]
    args += ["--host=%s=%s" % (n, p) for p, n in host_map]
    return subprocess.run(args + inputs, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_where_command_prints_where_a_message_is_queued_and_its_journey(fleet_dir):
    base, hosts = fleet_dir
    hub_rec = [r for r in _snapshot(base, "hub") if r["message_id"] == "<far-1@test.example>"]
    assert len(hub_rec) == 1
    done = _where(base, hosts, "message-id=far-1@test.example", base / "where")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["query"] == {"message-id": "far-1@test.example"}
    assert [(q["host"], q["n"], q["state"], q["recipients_left"], q["sender"])
            for q in answer["queued"]] == \
        [("hub", hub_rec[0]["n"], "S5", ["r1@far.example"], "a@test.example")]
    assert 0 <= answer["queued"][0]["age"] < 300
    journeys = answer["journeys"]
    assert [(j["route"], j["ended"]) for j in journeys] == [("relay>mx>hub", "queued")]
    assert journeys[0]["hops"][2]["n"] == hub_rec[0]["n"]
    assert "qmail-audit: loop: 1" in done.stderr        # the audit's lines: on standard error


@pytest.mark.slow
def test_where_command_exits_1_when_nothing_matches(tmp_path):
    """qmail-audit(8): with --where, 1 when no message matched (as qmailctl queue's filters),
    the answer still printed; one small snapshot, so one cheap run."""
    snap = tmp_path / "mx" / "queue.snapshot"
    snap.parent.mkdir()
    with open(snap, "w", encoding="utf-8") as f:
        snapshot_format.write([
            snapshot_format.header("mx", "/var/qmail", "log", 2000.0, 604800),
            _record("a@x.example", [("u@one.example", False)], "<m.1@x.example>"),
            snapshot_format.trailer("mx", 1)], f)
    done = subprocess.run([os.path.join(VENV_BIN, "qmail-audit"), "--master", "local[1]",
                           "--where", "message-id=<nothing@x.example>", "--out",
                           str(tmp_path / "out"), "--no-parquet", str(snap)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["query"] == {"message-id": "nothing@x.example"}
    assert answer["queued"] == [] and answer["journeys"] is None
    assert answer["snapshots"] == {"mx": 2000.0}


def test_where_refuses_an_unknown_key(tmp_path):
    done = subprocess.run([os.path.join(VENV_BIN, "qmail-audit"), "--where", "subject=hi",
                           "--out", str(tmp_path / "out"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--where wants KEY=VALUE with KEY one of sender, recipient, message-id" in done.stderr


@pytest.mark.slow
def test_host_with_a_log_but_no_snapshot_is_a_warning_not_a_crash(spark, fleet_dir):
    base, hosts = fleet_dir
    result = _audit(spark, base, hosts, base / "nohub", names_with_snapshot=("relay", "mx"))
    assert result.bad_inputs == [] and result.exit_code == 1       # the loop
    assert any(w.startswith("log of host hub has no snapshot among the inputs")
               for w in result.warnings), result.warnings
    fq = result.summary["fleet_queue"]
    assert [h["host"] for h in fq["hosts"]] == ["mx", "relay"]
    fl = result.summary["fleet"]
    assert fl["linked"] == 2 * COUNT + 2 and fl["by_end"].get("open") == COUNT
    assert "vanished-in-fleet" not in result.findings_by_kind
