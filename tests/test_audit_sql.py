"""The audit's JVM parser (--parser=sql) against the Python one, line by line and whole runs.

Every line logparse.parse_line reads must come out of logsql.lines as the same
event, line kind, bad-line class and time; a whole audit of generated logs with
defects, bad lines and every timestamp style must write the same summaries.json
and findings with either parser.
"""
import gzip
import json
import os

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("pyspark")

from qmailpy import logline  # noqa: E402
from qmailpy_audit import job, logparse, logsql, synthetic  # noqa: E402
from shared_data import data_file  # noqa: E402

EPOCH = data_file("qmail-send-sample.epoch.log")
TAI64N = data_file("qmail-send-sample.tai64n.log")
T = 1795323135.653157

WRITTEN = [
    logline.status(1, 10, 2, 20).decode(), logline.status(0, 10, 0, 20, True).decode(),
    logline.status_exiting().decode(), logline.new_msg(42).decode(),
    logline.info_msg(42, 1234, "a@b.example", 4242, 1000).decode(),
    logline.info_msg(43, 0, "", 1, 0).decode(),
    logline.starting_delivery(7, 42, "remote", "r@far.example").decode(),
    logline.starting_delivery(8, 42, "local", "").decode(),
    logline.delivery(7, "success", "127.0.1.2_accepted_message./Remote_host_said:_250_ok/")
    .decode(),
    logline.delivery(8, "deferral", "").decode(), logline.delivery(9, "failure", "x").decode(),
    logline.report_mangled(10).decode(), logline.bounce_msg(42, 5555).decode(),
    logline.triple_bounce(42).decode(), logline.end_msg(42).decode(),
    logline.command_msg("delete", 5).decode(), logline.command_msg("hold", 5).decode(),
    logline.command_msg("release", 5).decode(), logline.command_msg("requeue", 5).decode(),
    logline.bounce_now(5, "by the administrator").decode(), logline.alert("oops").decode(),
    logline.warning("trouble").decode(), logline.state_restored(5, 3, 120, 3, 99).decode(),
    logline.set_aside(6, "cannot read info/6").decode(),
    logline.throttling("slow.example", "concurrencyremote", "3").decode(),
    logline.ended_without_body(7, "mess/7/7").decode(),
]
TEXTS = [w.rstrip("\n") for w in WRITTEN] + [
    "new msg 0042", "delivery 5: succ", "new msg", "hello there", "   ", "", "end msg 5 ",
    "end msg 5\u2028", "info msg 1: bytes 2 from <a b> qp 3 uid 4", "starting delivery 1",
    "bo", "tr", "status: local 1/2 remote 3/4 exitasap extra",
]
FRAMING = ["-- No entries --", "-- Reboot --  ", "-- Boot 3f2a9c0d4e5b46a7b8c9d0e1f2a3b4c5 --",
           "-- Logs begin at Mon 2026-11-16 08:00:01 UTC, end at Sun 2026-11-22 10:12:14 UTC. --",
           "-- hello --", "--  No entries --"]
PREFIXES = [synthetic.prefix(style, T, "mx9") for style in ("epoch", "tai64n", "iso", "journald")]
PREFIXES += ["", "1795323135 ", "2026-11-22 10:12:14+02:00 ", "2026-11-22T10:12:14-0130 ",
             "2026-11-22T10:12:14.5 ", "2026-11-22T10:12:14Z mx9 qmail-send: ",
             "@4000000069f5f1a2ffffffff ", "@400000006 "]


@pytest.fixture(scope="module")
def spark():
    from qmailpy.cli.qmail_audit import session
    s = session("local[2]", "qmail-audit-sql-tests")
    yield s
    s.stop()


def _python_rows(lines):
    """logparse's reading of each line, in the shape logsql gives it."""
    out = []
    for i, line in enumerate(lines):
        p = logparse.parse_line("filehost", 0, i, line)
        if p[0] == "ignored":
            out.append(("ignored:" + p[1], "filehost", i, None, None, None))
        elif p[0] == "bad":
            out.append(("bad:" + p[1], p[2], i, None, None, p[5]))
        else:
            out.append((p[0], p[1], i, p[3], p[4], None))
    return out


def _sql_rows(spark, lines):
    df = spark.createDataFrame([("filehost", 0, i, line) for i, line in enumerate(lines)],
                               "host string, rank int, index long, line string")
    rows = sorted(logsql.lines(df).collect(), key=lambda r: r["index"])
    return [(r["lkind"], r["host"], r["index"], r["time"],
             logsql.event_tuple(r) if r["ekind"] else None, r["text"]) for r in rows]


def test_every_line_parses_as_logparse_parses_it(spark):
    lines = [p + t for p in PREFIXES for t in TEXTS] + FRAMING
    assert _sql_rows(spark, lines) == _python_rows(lines)


@pytest.mark.skipif(EPOCH is None, reason="shared/data fixtures not found")
def test_the_shared_qmail_logs_parse_alike(spark):
    for path in (EPOCH, TAI64N):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        assert _sql_rows(spark, lines) == _python_rows(lines)


def _fleet_inputs(tmp_path):
    """Logs in four timestamp styles with defects, bad lines and a gzip file, under one
    directory argument: host `in`, but for the journald lines, which name host beta."""
    a = tmp_path / "in" / "alpha"
    b = tmp_path / "in" / "beta"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    synthetic.generate(str(a / "current"), messages=400, seed=5, style="tai64n", host="alpha",
                       defects={"duplicate-delivery": 2, "illegal-transition": 1,
                                "never-ended": 2, "vanished": 1, "failure-not-bounced": 1,
                                "stale-leftover": 1},
                       snapshot_path=str(a / "snapshot"))
    synthetic.generate(str(b / "old"), messages=300, seed=6, style="journald", host="beta",
                       defects={"delivery-after-end": 1, "past-lifetime": 1},
                       start=1794990000.0, expired=2)
    synthetic.generate(str(b / "current"), messages=300, seed=7, style="iso", host="beta",
                       start=1795000000.0)
    with open(a / "current", "a") as f:
        f.write("-- Reboot --\n@400000006af5f1a2 delivery 77: succ\nsomething else\n\n"
                "end msg 5\n")
    epoch = tmp_path / "epoch.log"
    synthetic.generate(str(epoch), messages=100, seed=8, style="epoch", host="gamma")
    with open(epoch, "rb") as f:
        data = gzip.compress(f.read() + b"1795009999.000002 new msg\n")
    (tmp_path / "in" / "gamma").mkdir()
    (tmp_path / "in" / "gamma" / "rotated").write_bytes(data)
    return [str(tmp_path / "in")]


def _audit(spark, inputs, out, parser):
    result = job.audit(spark, inputs, str(out), job.Options(
        write_parquet=True, parser=parser, queuelifetime=synthetic.LIFETIME,
        lifetime_slack=synthetic.SLACK))
    with open(os.path.join(out, "summaries.json")) as f:
        summary = json.load(f)
    findings = sorted(tuple(r) for r in spark.read.parquet(
        "file://" + os.path.join(out, "findings.parquet")).collect())
    return result, summary, findings


def test_both_parsers_give_the_same_audit(spark, tmp_path):
    inputs = _fleet_inputs(tmp_path)
    old, old_summary, old_findings = _audit(spark, inputs, str(tmp_path / "python"), "python")
    new, new_summary, new_findings = _audit(spark, inputs, str(tmp_path / "sql"), "sql")
    kinds = {b["kind"] for b in old.bad_inputs}
    assert {"truncated-line", "unknown-line", "empty-line", "no-timestamp"} <= kinds
    assert old.findings_by_kind["duplicate-delivery"] == 2
    assert old_summary["log"]["ignored"] == {"journald-marker": 1}
    assert new_summary == old_summary
    assert new_findings == old_findings
    assert new.exit_code == old.exit_code == 2
