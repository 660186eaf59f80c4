"""The audit's JVM parser (--parser=sql) against the Python one, line by line and whole runs.

Every line logparse.parse_line reads must come out of logsql.lines as the same
event, line kind, bad-line class and time; a whole audit of generated logs with
every defect, snapshots, relays, bad lines and every timestamp style, and of the
shared qmail logs, must write the same tables row for row, summaries.json and
findings with either parser (--parser=sql checks most messages in the JVM, msgsql).
"""
import gzip
import json
import os

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("pyspark")

from qmailpy import logline  # noqa: E402
from qmailpy_audit import inputs as inputs_mod  # noqa: E402
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


def test_word_fields_cut_each_field_the_regular_expression_finds():
    """logsql cuts a field of one word from the text split at spaces (no regular expression
    run per field): for every line qmail-send writes, each such cut equals the group."""
    checked = 0
    for text in TEXTS:
        for kind, pattern in logline._PATTERNS:
            m = pattern.match(text)
            if m is None:
                continue
            words = text.split(" ")
            for name, (number, before, after) in (logsql.WORD_FIELDS[kind] or {}).items():
                word = words[number - 1]
                assert word[before:len(word) - after] == m.group(name), (text, name)
                checked += 1
            break
    assert checked >= 30
    assert logsql.WORD_FIELDS["status"] is None       # ' exitasap' inside a group
    assert logsql.WORD_FIELDS["bounce now"] is None   # free text with spaces


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
    synthetic.generate(str(a / "current"), messages=200, seed=5, style="tai64n", host="alpha",
                       defects={"duplicate-delivery": 2, "illegal-transition": 1,
                                "never-ended": 2, "vanished": 1, "failure-not-bounced": 1,
                                "stale-leftover": 1},
                       snapshot_path=str(a / "snapshot"))
    synthetic.generate(str(b / "old"), messages=150, seed=6, style="journald", host="beta",
                       defects={"delivery-after-end": 1, "past-lifetime": 1},
                       start=1794990000.0, expired=2)
    synthetic.generate(str(b / "current"), messages=150, seed=7, style="iso", host="beta",
                       start=1795000000.0)
    with open(a / "current", "a") as f:
        f.write("-- Reboot --\n@400000006af5f1a2 delivery 77: succ\nsomething else\n\n"
                "end msg 5\n")
    epoch = tmp_path / "epoch.log"
    synthetic.generate(str(epoch), messages=50, seed=8, style="epoch", host="gamma")
    with open(epoch, "rb") as f:
        data = gzip.compress(f.read() + b"1795009999.000002 new msg\n")
    (tmp_path / "in" / "gamma").mkdir()
    (tmp_path / "in" / "gamma" / "rotated").write_bytes(data)
    return [str(tmp_path / "in")]


TABLES = ("messages", "transitions", "qmailanalog_m", "deliveries", "findings")


def _tables(spark, out):
    """Every row of the audit's per-message tables, sorted, by table. A transition's seq
    orders the lines of its file, but its value depends on how the file was split
    (the parsers split files differently): it is replaced by its rank in its message."""
    tables = {name: [r.asDict() for r in spark.read.parquet(
        "file://" + os.path.join(out, name + ".parquet")).collect()] for name in TABLES}
    ranks = {}
    for r in tables["transitions"]:
        if r["seq"] is not None:
            ranks.setdefault((r["host"], r["n"]), []).append(r["seq"])
    for seqs in ranks.values():
        seqs.sort()
    for r in tables["transitions"]:
        if r["seq"] is not None:
            r["seq"] = ranks[(r["host"], r["n"])].index(r["seq"])
    return {name: sorted((tuple(r.values()) for r in rows), key=repr)
            for name, rows in tables.items()}


def _shapes_inputs(tmp_path):
    """Every shape a message takes: defects of every kind, expired messages, bounces,
    deferrals, a snapshot (alpha's) with its own defects, relays between hosts, and the
    shared qmail logs."""
    inputs = _fleet_inputs(tmp_path)
    delta = tmp_path / "delta"
    delta.mkdir()
    synthetic.generate(str(delta / "current"), messages=200, seed=9, style="tai64n",
                       host="delta", start=1795100000.0, expired=3,
                       defects={"vanished": 2, "unlogged": 1, "snapshot-illegal": 1,
                                "files-disagree": 1, "duplicate-delivery": 1,
                                "failure-not-bounced": 1, "never-ended": 1},
                       snapshot_path=str(delta / "snapshot"))
    inputs.append("delta=%s" % delta)
    synthetic.generate_fleet(str(tmp_path / "fleet"), hosts=3, messages=80, seed=3)
    inputs += [str(p) for p in sorted((tmp_path / "fleet").iterdir())]
    for path in (EPOCH, TAI64N):
        if path is not None:
            inputs.append("shared-%s=%s" % (os.path.basename(path).split(".")[1], path))
    return inputs


def test_both_parsers_give_the_same_tables_row_for_row(spark, tmp_path):
    """--parser=sql checks the messages of the common shape in the JVM (msgsql) and the
    rest in Python; every table must hold exactly the rows the Python path writes, and
    summaries.json, bad-input examples and exit status must be the same."""
    inputs = _shapes_inputs(tmp_path)
    named = [i for i in inputs if "=" in i]
    host_map = inputs_mod.parse_host_map(named)
    inputs = [i for i in inputs if "=" not in i] + [i.split("=", 1)[1] for i in named]
    out, results = {}, {}
    for parser in ("python", "sql"):
        out[parser] = str(tmp_path / parser)
        result = job.audit(spark, inputs, out[parser], job.Options(
            write_parquet=True, parser=parser, queuelifetime=synthetic.LIFETIME,
            lifetime_slack=synthetic.SLACK, host_map=host_map))
        if parser == "sql":
            assert result.checked_in_jvm > 0.8 * result.summary["messages"]["messages"]
        results[parser] = result
    old, new = _tables(spark, out["python"]), _tables(spark, out["sql"])
    for name in TABLES:
        assert len(new[name]) == len(old[name]), name
        assert new[name] == old[name], name
    kinds = {r[3] for r in old["findings"]}
    assert {"failure-not-bounced", "duplicate-delivery", "past-lifetime", "vanished",
            "never-ended", "unlogged", "delivery-after-end", "illegal-transition"} <= kinds
    kinds = {b["kind"] for b in results["python"].bad_inputs}
    assert {"truncated-line", "unknown-line", "empty-line", "no-timestamp"} <= kinds
    with open(os.path.join(out["python"], "summaries.json")) as f:
        old_summary = json.load(f)
    assert old_summary["log"]["ignored"] == {"journald-marker": 1}
    with open(os.path.join(out["sql"], "summaries.json")) as f:
        assert json.load(f) == old_summary
    assert results["sql"].exit_code == results["python"].exit_code == 2


def test_a_fleet_checked_wholly_in_the_jvm_gives_pythons_tables(spark, tmp_path):
    """A fleet whose every message is of the common shape, no snapshot: the JVM checks all
    of them and Python's per-message stages are not run at all; the tables, journeys and
    summaries.json are still Python's."""
    from qmailpy_audit.fleet import parse_map
    text, expects = synthetic.generate_fleet(str(tmp_path / "fleet"), hosts=3, messages=60,
                                             seed=11)
    inputs = [str(p) for p in sorted((tmp_path / "fleet").iterdir())]
    out, results = {}, {}
    for parser in ("python", "sql"):
        out[parser] = str(tmp_path / parser)
        results[parser] = job.audit(spark, inputs, out[parser], job.Options(
            write_parquet=True, parser=parser, fleet_map=parse_map(text.splitlines())))
    messages = results["sql"].summary["messages"]["messages"]
    assert messages >= 180 and results["sql"].checked_in_jvm == messages
    assert results["sql"].summary["fleet"]["linked"] == sum(len(e.handoffs) for e in expects)
    assert results["sql"].summary == results["python"].summary
    assert _tables(spark, out["sql"]) == _tables(spark, out["python"])
    journeys = {p: sorted(repr(r.asDict(recursive=True)) for r in spark.read.parquet(
        "file://" + os.path.join(out[p], "journeys.parquet")).collect()) for p in out}
    assert journeys["sql"] == journeys["python"] and len(journeys["sql"]) > 0
