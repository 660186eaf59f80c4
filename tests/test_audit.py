"""qmail-audit on Spark (local mode, one shared SparkSession for the whole file).

The shared notqmail sample must give the README's exact counts and no
violation; generated logs and snapshots with counted defects must give exactly
those findings and figures; bad input is counted and the rest audited.
"""
import gzip
import io
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from qmailpy.logfiles import log_set

pytestmark = pytest.mark.slow

pyspark = pytest.importorskip("pyspark")

from qmailpy_audit import job, synthetic  # noqa: E402
from shared_data import data_file  # noqa: E402

BIN = os.path.dirname(sys.executable)
SPARK_HOME = os.path.dirname(pyspark.__file__)

EPOCH = data_file("qmail-send-sample.epoch.log")
TAI64N = data_file("qmail-send-sample.tai64n.log")
SNAPSHOT_TEXT = data_file("qmail-queue-snapshot.txt")
needs_data = pytest.mark.skipif(EPOCH is None, reason="shared/data fixtures not found")


@pytest.fixture(scope="session")
def spark():
    from qmailpy.cli.qmail_audit import session
    s = session("local[2]", "qmail-audit-tests")
    yield s
    s.stop()


def _copy(src, directory, name):
    os.makedirs(directory, exist_ok=True)
    dst = os.path.join(directory, name)
    shutil.copyfile(src, dst)
    return dst


def _audit(spark, inputs, out, **kw):
    kw.setdefault("write_parquet", False)
    return job.audit(spark, [str(i) for i in inputs], str(out), job.Options(**kw))


def _percentile(values, p):
    """Linear between closest ranks, as Spark's exact percentile()."""
    v = sorted(values)
    pos = (len(v) - 1) * p
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _sample_dlines():
    """matchup's d lines of the epoch sample, by the pure-Python per-message logic."""
    from qmailpy_audit import logparse, messages
    events = []
    with open(EPOCH) as f:
        for i, line in enumerate(f):
            parsed = logparse.parse_line("mx", 0, i, line.rstrip("\n"))
            if parsed[4] is not None:
                events.append(parsed[4])
    from audit_support import groups_of
    groups = groups_of(events)
    ctx = messages.HostContext()
    return [dict(zip(messages.DLINE_FIELDS, r[1])) for n, items in groups.items()
            for r in messages.process_group("mx", n, items, ctx) if r[0] == "d"]


def _check_breakdowns(s):
    """Per domain, hour and sender, against sums over the d lines made here."""
    import time as time_mod
    dl = _sample_dlines()
    assert len(dl) == 481

    def delays(rows):
        return [r["ddone"] - r["birth"] for r in rows if r["result"] == "k"]

    for key, table, of in (("domain", "per_domain", lambda r: r["domain"]),
                           ("hour", "per_hour", lambda r: time_mod.strftime(
                               "%Y-%m-%d %H:00", time_mod.gmtime(int(r["ddone"]))))):
        rows = {r[key]: r for r in s[table]}
        keys = {of(r) for r in dl}
        assert keys <= set(rows)
        for k in keys:
            got = rows[k]
            dd = delays([r for r in dl if of(r) == k])
            assert got["success"] == len(dd), (table, k)
            if not dd:
                assert got["avg_ddelay"] is None and got["p50_ddelay"] is None
                continue
            assert got["avg_ddelay"] == pytest.approx(sum(dd) / len(dd), rel=1e-9)
            for p in (50, 90, 99):
                assert got["p%d_ddelay" % p] == pytest.approx(_percentile(dd, p / 100.0),
                                                              rel=1e-9), (table, k, p)
    sink = {r["domain"]: r for r in s["per_domain"]}["sink.example"]
    assert sink["p50_ddelay"] <= sink["p90_ddelay"] <= sink["p99_ddelay"]
    senders = {r["sender"]: r for r in s["per_sender"]}
    for sender in {r["sender"] for r in dl}:
        mine = [r for r in dl if r["sender"] == sender]
        got = senders[sender]
        assert (got["success"], got["failure"], got["deferral"]) == tuple(
            sum(1 for r in mine if r["result"] == c) for c in "kdz"), sender
    assert sum(r["success"] for r in s["per_sender"]) == 353
    assert sum(r["deferral"] for r in s["per_sender"]) == 81


def _sample_checks(result):
    s = result.summary
    assert s["log"]["lines"] == 2951
    assert s["log"]["by_kind"] == {
        "status": 963, "exiting": 1, "new msg": 333, "info msg": 333,
        "starting delivery": 481, "delivery": 481, "bounce msg": 45, "triple bounce": 2,
        "end msg": 312}
    m = s["messages"]
    assert (m["messages"], m["numbers"], m["ended"], m["not_ended"]) == (333, 260, 312, 21)
    assert (m["bounces"], m["triple_bounces"], m["orphans"]) == (45, 2, 0)
    ch = s["deliveries"]["by_channel"]
    assert ch["local"] == {"attempts": 305, "success": 262, "failure": 33, "deferral": 10}
    assert ch["remote"] == {"attempts": 176, "success": 91, "failure": 14, "deferral": 71}
    q = s["qmailanalog"]
    assert q["completed_messages"] == 312
    assert (q["delivery_attempts"], q["success"], q["failure"], q["deferral"]) == (481, 353, 47, 81)
    # an independent port of qmailanalog's matchup + zoverall, to its printed precision
    assert (q["bytes"], q["bytes_weighted_by_success"]) == (1613710, 1797724)
    assert q["qtime_total"] == pytest.approx(1053.0984, abs=5e-5)
    assert q["ddelay_total"] == pytest.approx(1053.9548, abs=5e-5)
    assert q["xdelay_total"] == pytest.approx(6.44035, abs=5e-6)
    assert q["time_span"] == pytest.approx(156.154, abs=5e-4)
    assert q["concurrency"] == pytest.approx(0.0412436, abs=5e-8)
    domains = {r["domain"]: r for r in s["per_domain"]}
    assert domains["sink.example"]["success"] == 73          # README cross-check table
    assert domains["responder.example"]["success"] == 18
    assert result.violations == 0 and result.exit_code == 0
    assert result.findings_by_kind == {"never-ended": 21}
    assert s["bad_input"] == []
    return q


@needs_data
def test_shared_sample_epoch_and_tai64n_give_the_readme_counts(spark, tmp_path):
    host = tmp_path / "mx"
    epoch = _audit(spark, [_copy(EPOCH, host, "epoch.log"), _copy(SNAPSHOT_TEXT, host, "q.txt")],
                   tmp_path / "out-epoch", write_parquet=True)
    q1 = _sample_checks(epoch)
    _check_breakdowns(epoch.summary)
    html = (tmp_path / "out-epoch" / "report.html").read_text()
    assert "<th>p99_ddelay</th>" in html and "<th>deferral</th>" in html
    tai = _audit(spark, [_copy(TAI64N, tmp_path / "mx2", "tai.log")], tmp_path / "out-tai")
    q2 = _sample_checks(tai)
    for key, value in q1.items():
        assert q2[key] == pytest.approx(value, rel=1e-12, abs=1e-6), key
    # the zoverall definitions, recomputed from the m and d lines independently
    assert q1["recipients"] == 393 and q1["attempts_for_completed"] == 411
    out = tmp_path / "out-epoch"
    text = (out / "zoverall.txt").read_text()
    for line in ("Completed messages: 312", "Recipients for completed messages: 393",
                 "Total delivery attempts for completed messages: 411",
                 "Bytes in completed messages: 1613710", "Bytes weighted by success: 1797724",
                 "Average message qtime (s): 3.37532", "  deferral: 81",
                 "Total ddelay (s): 1053.954766", "Total xdelay (s): 6.440349",
                 "Time span (s): 156.154", "Queue concurrency: 0.0412436"):
        assert "\n" + line + "\n" in "\n" + text, line
    # the 21 still-queued messages are exactly the 21 in the notqmail snapshot
    import pyarrow.parquet as pq
    tr = pq.read_table(str(out / "transitions.parquet")).to_pylist()
    seen = [t for t in tr if t["event"] == "snapshot"]
    assert len(seen) == 21 and all(t["legal"] for t in seen)
    assert all(t["legal"] for t in tr)
    findings = pq.read_table(str(out / "findings.parquet")).to_pylist()
    assert sorted(f["kind"] for f in findings) == ["never-ended"] * 21
    html = (out / "report.html").read_text()
    # the four plots, and the fleet queue's messages by age (the snapshot)
    assert html.count("<svg") == 5 and "No violation found." in html
    assert "Fleet queue: what is queued where" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    summary = json.loads((out / "summaries.json").read_text())
    assert summary["messages"]["numbers"] == 260


ALL = {kind: 2 for kind in synthetic.LOG_DEFECTS + synthetic.SNAPSHOT_DEFECTS}


def _check_expected(result, expect):
    s = result.summary
    assert s["log"]["by_kind"] == expect.lines
    m = s["messages"]
    assert m["messages"] == expect.messages
    assert m["numbers"] == len(expect.numbers)
    assert m["ended"] == expect.ended
    assert m["bounces"] == expect.bounces
    q = s["qmailanalog"]
    for key, value in expect.qmailanalog().items():
        assert q[key] == pytest.approx(value, rel=1e-9, abs=1e-5), key
    assert result.findings_by_kind == expect.findings


def test_generated_defects_of_every_kind_are_found_exactly(spark, tmp_path):
    log = tmp_path / "mx1" / "current"
    log.parent.mkdir()
    snap = tmp_path / "mx1.snapshot"
    # with 4 clean messages that expire and bounce as qmail does: not findings
    expect = synthetic.generate(str(log), messages=400, seed=7, style="journald",
                                defects=ALL, snapshot_path=str(snap), expired=4)
    # the snapshot names its host itself; the journald lines carry it too
    result = _audit(spark, [log, snap], tmp_path / "out", queuelifetime=synthetic.LIFETIME,
                    lifetime_slack=synthetic.SLACK)
    _check_expected(result, expect)
    assert result.warnings == []
    assert set(result.findings_by_kind) >= {"illegal-transition", "delivery-after-end",
                                            "duplicate-delivery", "failure-not-bounced",
                                            "past-lifetime", "vanished", "stale-leftover",
                                            "files-disagree", "never-ended", "unlogged"}
    assert result.violations == sum(v for k, v in expect.findings.items()
                                    if k not in ("never-ended", "unlogged"))
    assert result.exit_code == 1
    html = (tmp_path / "out" / "report.html").read_text()
    assert "violation(s) found" in html


def test_clean_logs_of_two_hosts_in_iso_and_tai64n_find_nothing(spark, tmp_path):
    a = tmp_path / "a" / "log"
    b = tmp_path / "b" / "log"
    a.parent.mkdir()
    b.parent.mkdir()
    ea = synthetic.generate(str(a), messages=150, seed=1, style="iso", host="alpha")
    eb = synthetic.generate(str(b), messages=120, seed=2, style="tai64n", host="beta")
    # beta's log was rotated and compressed by logrotate, under a name without .gz
    b.write_bytes(gzip.compress(b.read_bytes()))
    # a snapshot of a third host: no log of it, and no snapshot of alpha or beta
    from qmailpy import snapshot_format
    gamma = tmp_path / "gamma.snapshot"
    with open(gamma, "w") as f:
        snapshot_format.write([snapshot_format.header("gamma", "/var/qmail", "dir",
                                                      1795000500.0, 604800),
                               snapshot_format.trailer("gamma", 0)], f)
    result = _audit(spark, [a, b, gamma], tmp_path / "out",
                    host_map=[(str(a.parent), "alpha"), (str(b.parent), "beta")])
    assert result.exit_code == 0 and result.findings_by_kind == {}
    assert [w.split(" has ")[0] for w in result.warnings] == [
        "snapshot of host gamma", "log of host alpha", "log of host beta"]
    from qmailpy.cli.qmail_audit import tell
    out, err = io.StringIO(), io.StringIO()
    tell(result, str(tmp_path / "out"), out, err)
    assert "qmail-audit: warning: snapshot of host gamma has no log among the inputs" \
        in err.getvalue()
    assert err.getvalue().count("qmail-audit: warning: ") == 3
    assert out.getvalue().startswith("qmail-audit: 0 violation(s); report: ")
    html = (tmp_path / "out" / "report.html").read_text()
    assert "warning: log of host beta has no snapshot among the inputs" in html
    assert json.loads((tmp_path / "out" / "summaries.json").read_text())["warnings"] \
        == result.warnings
    hosts = {r["host"]: r for r in result.summary["per_host"]}
    assert set(hosts) == {"alpha", "beta"}
    assert hosts["alpha"]["messages"] == ea.messages
    assert hosts["beta"]["messages"] == eb.messages
    assert result.bad_inputs == []
    assert result.summary["log"]["by_kind"]["end msg"] == ea.lines["end msg"] + eb.lines["end msg"]
    assert hosts["alpha"]["numbers"] == len(ea.numbers)
    q = result.summary["qmailanalog"]
    assert q["completed_messages"] == ea.ended + eb.ended
    assert q["delivery_attempts"] == len(ea.d) + len(eb.d)


def test_bad_input_is_counted_and_the_rest_audited(spark, tmp_path):
    log = tmp_path / "mx1" / "current"
    log.parent.mkdir()
    snap = tmp_path / "mx1.snapshot"
    expect = synthetic.generate(str(log), messages=200, seed=11, style="epoch",
                                defects={"duplicate-delivery": 1, "stale-leftover": 1},
                                snapshot_path=str(snap))
    with open(log, "a") as f:
        f.write("-- Boot 3f2a9c0d4e5b46a7b8c9d0e1f2a3b4c5 --\n")  # journalctl's framing
        f.write("-- No entries --\n")
        f.write("1795009999.000001 delivery 77: succ\n")          # cut short
        f.write("1795009999.000002 new msg\n")                     # cut short
        f.write("1795009999.000003 something qmail never says\n")  # unknown
    torn = tmp_path / "torn.snapshot"
    lines = snap.read_text().splitlines(True)
    torn.write_text("".join(lines[:-1]))                            # no end record
    corrupt = tmp_path / "corrupt.snapshot"
    corrupt.write_text(lines[0] + '{"record": "message", "host": \n' + lines[-1])
    # a well-formed line with a wrongly typed recipient, between good ones
    typed = tmp_path / "typed.snapshot"
    wrong = '{"record":"message","host":"mx1","n":5,"backend":"dir","files":{},' \
            '"recipients":[1],"problems":[]}\n'
    trailer = json.loads(lines[-1])
    trailer["messages"] += 1
    typed.write_text("".join(lines[:-1]) + wrong + json.dumps(trailer) + "\n")
    missing = tmp_path / "no-such-log"
    result = _audit(spark, [log, snap, torn, corrupt, typed, missing], tmp_path / "out")
    bad = {b["kind"]: b["count"] for b in result.bad_inputs}
    assert bad == {"truncated-line": 2, "unknown-line": 1, "corrupt-snapshot": 3,
                   "unreadable-path": 1}
    (corrupt_snapshots,) = [b for b in result.bad_inputs if b["kind"] == "corrupt-snapshot"]
    assert {"path": "file:" + str(typed), "kind": "corrupt-snapshot",
            "detail": "line %d: message record: recipient 1 is not {channel, address, done}"
            % len(lines)} in corrupt_snapshots["examples"]
    assert result.exit_code == 2
    assert result.summary["log"]["ignored"] == {"journald-marker": 2}
    # the good lines were audited all the same
    assert result.summary["messages"]["messages"] == expect.messages
    assert result.findings_by_kind["duplicate-delivery"] == 1
    # the torn and the mistyped copies are still checked: the leftover is found thrice
    assert result.findings_by_kind["stale-leftover"] == 3
    html = (tmp_path / "out" / "report.html").read_text()
    assert "truncated-line" in html and "unreadable-path" in html


def test_log_backend_segments_are_checked_record_by_record(spark, tmp_path):
    logrecords = pytest.importorskip("qmailpy.backends.log.records")
    L = logrecords
    seg = tmp_path / "mx3" / "0000000003.seg"
    seg.parent.mkdir()
    data = L.segment_header(3)
    # message 5: a clean life; message 6: START after FINISH (illegal)
    data += L.encode_envelope(1, 5, 0, 9, b"a@b", [b"c@d"])
    data += L.encode_snapshot(L.PREPROCESSED, 2, 5, (3, 24), 1, 9, 0, 100, b"a@b", b"", (),
                              {"remote": (2, [(False, b"c@d")])})
    data += L.encode_start(3, 5, (3, 24), "remote")
    data += L.encode_delivery(3, 5, "remote", 0, L.SUCCESS)
    data += L.encode_finish(4, 5, (3, 24))
    data += L.encode_envelope(5, 6, 0, 9, b"a@b", [b"c@d"])
    data += L.encode_finish(6, 6, (3, 24))
    data += L.encode_delivery(7, 6, "remote", 0, L.FAILURE)
    broken = bytearray(L.encode_envelope(8, 7, 0, 9, b"a@b", [b"c@d"]))
    broken[-1] ^= 1                                    # checksum no longer holds
    data += bytes(broken) + L.encode_envelope(9, 8, 0, 9, b"x@y", [])
    data += L.encode_envelope(10, 9, 0, 9, b"x@y", [])[:11]        # torn tail
    seg.write_bytes(data)
    result = _audit(spark, [seg], tmp_path / "out")
    assert result.findings_by_kind == {"illegal-transition": 2, "segment-corrupt": 1,
                                       "segment-torn": 1}
    assert result.exit_code == 1
    bad_header = tmp_path / "mx4" / "0000000001.seg"
    bad_header.parent.mkdir()
    bad_header.write_bytes(b"QMAILLOG" + b"\0" * 30)
    result = _audit(spark, [bad_header], tmp_path / "out2")
    assert [b["kind"] for b in result.bad_inputs] == ["unreadable-segment"]
    assert result.exit_code == 2


def test_messages_restored_after_log_damage_are_reported(spark, tmp_path):
    from qmailpy import logline
    log = tmp_path / "mx5" / "current"
    log.parent.mkdir()
    t = 1700000000.0
    lines = [logline.status(0, 10, 0, 20), logline.new_msg(77),
             logline.info_msg(77, 120, b"a@b.example", 9, 0),
             logline.starting_delivery(1, 77, "remote", b"c@d.example"),
             logline.delivery(1, "deferral", "Connection_refused./"),
             logline.status_exiting(), logline.status(0, 10, 0, 20),
             logline.state_restored(77, 1, 2048, 1, 2240),
             logline.starting_delivery(1, 77, "remote", b"c@d.example"),
             logline.delivery(1, "success", "accepted/"), logline.end_msg(77)]
    log.write_bytes(b"".join(b"%.6f %s" % (t + i, line) for i, line in enumerate(lines)))
    result = _audit(spark, [log], tmp_path / "out")
    assert result.findings_by_kind == {"restored-after-damage": 1}
    assert result.exit_code == 0                           # a notice: nothing was lost
    [restored] = result.summary["findings"]["restored"]
    assert (restored["host"], restored["n"], restored["time"]) == ("mx5", 77, t + 7)
    assert restored["detail"] == ("state restored from log segment 1 offset 2048 after damage "
                                  "at segment 1 offset 2240")
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Messages restored after log damage" in html and "offset 2240" in html


def test_messages_set_aside_are_counted(spark, tmp_path):
    """qmail-send's 'set aside' warning (docs/qmail-send.md "Messages set aside") is a
    finding of its own, once per line: at each start that meets the message."""
    from qmailpy import logline
    log = tmp_path / "mx6" / "current"
    log.parent.mkdir()
    t = 1700000000.0
    why = "5000 recipients take more than a log record holds once rewritten"
    lines = [logline.status(0, 10, 0, 20), logline.set_aside(91, why), logline.status_exiting(),
             logline.status(0, 10, 0, 20), logline.set_aside(91, why), logline.command_msg("delete", 91)]
    log.write_bytes(b"".join(b"%.6f %s" % (t + i, line) for i, line in enumerate(lines)))
    result = _audit(spark, [log], tmp_path / "out")
    assert result.findings_by_kind == {"set-aside": 2}
    assert not result.bad_inputs


# --- a standalone cluster: master and one worker from the pyspark package -----------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Daemon:
    """A Spark daemon run by spark-class; its output lines arrive on a queue."""

    def __init__(self, cls, args, env, log):
        self.proc = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), cls] + args, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines = queue.Queue()
        self.log = log
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, marker, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no %r from the Spark daemon" % marker) from None
            if line is None:
                raise AssertionError("Spark daemon exited: %s" % self.proc.wait())
            if marker in line:
                return

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def cluster(tmp_path):
    env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1",
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path / "logs"))
    port, worker_port = _free_port(), _free_port()
    daemons = []
    with open(tmp_path / "daemons.log", "wb") as log:
        try:
            master = _Daemon("org.apache.spark.deploy.master.Master",
                             ["--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"],
                             env, log)
            daemons.append(master)
            url = "spark://127.0.0.1:%d" % port
            master.wait_for(b"Starting Spark master at " + url.encode())
            worker = _Daemon("org.apache.spark.deploy.worker.Worker",
                             ["--host", "127.0.0.1", "--port", str(worker_port),
                              "--webui-port", "0", "--cores", "2", "--memory", "1g", url],
                             env, log)
            daemons.append(worker)
            worker.wait_for(b"Successfully registered with master")
            yield url, env
        finally:
            for daemon in daemons:
                daemon.stop()


def _cli(args, env):
    return subprocess.run([os.path.join(BIN, "qmail-audit")] + args, capture_output=True,
                          env=env, timeout=400)


def test_cluster_gives_the_same_result_as_local_mode(spark, cluster, tmp_path):
    url, env = cluster
    log = tmp_path / "mx1" / "current"
    log.parent.mkdir()
    snap = tmp_path / "mx1.snapshot"
    expect = synthetic.generate(str(log), messages=300, seed=5, style="tai64n", host="mx1",
                                defects={"duplicate-delivery": 1, "never-ended": 2,
                                         "stale-leftover": 1, "vanished": 1},
                                snapshot_path=str(snap))
    args = ["--host", "mx1=%s" % log.parent, str(log), str(snap)]
    on_cluster = _cli(["--master", url, "--no-parquet", "--out", str(tmp_path / "c")] + args,
                      env)
    assert on_cluster.returncode == 1, on_cluster.stderr.decode()[-2000:]
    assert b"report: " + str(tmp_path / "c" / "report.html").encode() in on_cluster.stdout
    assert b"duplicate-delivery: 1" in on_cluster.stderr
    assert b"warning" not in on_cluster.stderr
    local = _audit(spark, [log, snap], tmp_path / "l",
                   host_map=[(str(log.parent), "mx1")])
    c = json.loads((tmp_path / "c" / "summaries.json").read_text())
    l_ = json.loads(json.dumps(local.summary, default=str))
    for key in ("log", "messages", "deliveries", "qmailanalog", "per_domain", "per_host",
                "per_hour", "delays"):
        assert c[key] == l_[key], key
    assert c["findings"]["by_kind"] == l_["findings"]["by_kind"] == expect.findings
    assert c["messages"]["messages"] == expect.messages


def test_command_line_errors_need_no_spark(tmp_path):
    proc = _cli(["--host", "nonsense", "x"], os.environ)
    assert proc.returncode == 2 and b"NAME=PATH" in proc.stderr
    proc = _cli([], os.environ)
    assert proc.returncode == 2


# --- the real thing: qmailctl start, real deliveries, the home's own log and queue -----

def _wait_log(path, predicate, timeout=60):
    """Wait (inotify on the log directory) until predicate(text of the log) holds."""
    from inotify_simple import INotify, flags
    inotify = INotify()
    inotify.add_watch(os.path.dirname(path), flags.MODIFY | flags.CREATE)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:   # not yet written, or renamed by a rotation just now
                text = ""
            if predicate(text):
                return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("log condition not met; log:\n" + text[-3000:])
            inotify.read(timeout=int(left * 1000) + 1)
    finally:
        inotify.close()


def _in_log_set(logdir, needle):
    """How often needle occurs in qmail-send's log and its rotated files."""
    found = 0
    for path in log_set(logdir, "qmail-send.log"):
        try:
            with open(path, errors="replace") as f:
                found += f.read().count(needle)
        except FileNotFoundError:       # rotated away meanwhile: counted again next time
            return 0
    return found


def test_real_daemons_log_and_queue_audit_clean(spark, qmail_home, tmp_path):
    """qmailctl start's log rotated by size (control/logsize at its 4096-byte floor) and
    audited through the home: every rotated file is read, oldest first, with the queue."""
    home = qmail_home
    # remote mail to a port where nothing listens: deferred, left in the queue
    home.control("smtproutes", "closed.example:127.0.0.1:1\n")
    home.control("logsize", "4096\n")
    home.control("logcount", "5\n")
    start = home.run(["qmailctl", "start", "--home", home.path])
    assert start.returncode == 0, start.stderr
    logdir = os.path.join(home.path, "log")
    log = os.path.join(logdir, "qmail-send.log")
    count = 30
    try:
        for i in range(count):
            done = home.queue_message(b"Subject: %d\n\nhello\n" % i, b"a@test.example",
                                      [b"r%d@closed.example" % i])
            assert done.returncode == 0, done.stderr
            # one message at a time, so every file ends up holding whole messages' lines
            _wait_log(log, lambda text, i=i: _in_log_set(logdir, ": deferral: ") > i)
    finally:
        stop = home.run(["qmailctl", "stop", "--home", home.path])
    assert stop.returncode == 0, stop.stderr
    _wait_log(log, lambda text: "status: exiting" in text)
    files = log_set(logdir, "qmail-send.log")
    assert len(files) >= 3, files                 # rotated at least twice
    assert all(os.path.getsize(p) <= 4096 for p in files[:-1])
    assert all(os.stat(p).st_mode & 0o777 == 0o640 for p in files)
    result = _audit(spark, [home.path], tmp_path / "out",
                    host_map=[(home.path, socket.gethostname())])
    assert result.bad_inputs == []
    s = result.summary
    assert s["messages"]["messages"] == count and s["messages"]["not_ended"] == count
    assert s["deliveries"]["by_channel"]["remote"]["deferral"] >= count
    # all still queued: in the snapshot, hence noticed but no violation
    assert result.findings_by_kind == {"never-ended": count}
    assert result.exit_code == 0


# --- the delivery suite's own logs and queues: every home it ran must audit clean -----

DELIVERY_SUITE = ["tests/test_delivery_local.py", "tests/test_delivery_remote.py",
                  "tests/test_delivery_faults.py", "tests/test_delivery_qmailqueue.py"]


def test_delivery_suite_logs_and_queues_audit_clean(spark, tmp_path):
    """Run the delivery tests with QMAILPY_TEST_AUDIT_COLLECT (send_harness.Daemons then keeps
    each home's stamped qmail-send log and a queue snapshot) and audit every home as its
    own host: no bad input, no violation, only notices."""
    from knobs import AUDIT_COLLECT_ENV
    collect = tmp_path / "collect"
    collect.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **{AUDIT_COLLECT_ENV: str(collect)})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
                         + DELIVERY_SUITE, cwd=root, env=env, capture_output=True, timeout=1800)
    assert run.returncode == 0, (run.stdout + run.stderr).decode(errors="replace")[-5000:]
    homes = sorted(p for p in collect.iterdir() if p.is_dir())
    assert len(homes) >= 20, [p.name for p in homes]
    inputs, host_map, backends = [], [], set()
    for home in homes:
        meta = json.loads((home / "meta.json").read_text())
        assert meta["errors"] == [] and meta["host"] == home.name, meta
        backends.add(meta["backend"])
        log, snap = home / "send.log", home / "queue.snapshot"
        assert log.stat().st_size > 0 and snap.stat().st_size > 0, meta
        inputs += [log, snap]
        host_map.append((str(home), home.name))
    assert backends == {"dir", "log"}
    result = _audit(spark, inputs, tmp_path / "out", host_map=host_map)
    assert result.bad_inputs == []
    assert result.warnings == []            # every log has its snapshot and vice versa
    from qmailpy_audit import messages
    notices = {k for k, sev in messages.FINDING_KINDS.items() if sev != messages.VIOLATION}
    assert set(result.findings_by_kind) <= notices, result.findings_by_kind
    assert result.violations == 0 and result.exit_code == 0
    s = result.summary
    hosts = {r["host"]: r for r in s["per_host"]}
    assert set(hosts) == {h.name for h in homes}
    m = s["messages"]
    assert m["messages"] >= len(homes) and m["orphans"] == 0
    assert m["ended"] + m["not_ended"] == m["messages"]
    assert result.findings_by_kind.get("never-ended", 0) == m["not_ended"]
    ch = s["deliveries"]["by_channel"]
    assert ch["local"]["success"] > 0 and ch["remote"]["success"] > 0
    for c in ch.values():
        assert c["attempts"] == c["success"] + c["failure"] + c["deferral"]
    assert m["bounces"] > 0                 # the suite bounces failures, every one logged
    q = s["qmailanalog"]
    assert q["completed_messages"] == m["ended"]
    assert q["delivery_attempts"] == sum(c["attempts"] for c in ch.values())
    assert s["log"]["by_kind"]["new msg"] == m["messages"]
