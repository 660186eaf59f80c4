"""The audit's per-message logic without Spark: parsing, transition checks, snapshots."""
import os

from qmailpy import logline, snapshot, states
from spark import logparse, messages, report, segments, snapshots, synthetic

DATA = "/work/shared/data"
T0 = 1795000000.0


def _events(lines, host="h"):
    out = []
    for i, line in enumerate(lines):
        parsed = logparse.parse_line(host, 0, i, line)
        assert parsed[0] != "bad", parsed
        if parsed[4] is not None:
            out.append(parsed[4])
    return out


def _run(lines, ctx=None, snaps=()):
    """process_group over all numbers of a small log, as the Spark job wires it."""
    events = _events(lines)
    groups = {}
    by_d = {}
    for e in events:
        if e[3] in ("start", "result"):
            by_d.setdefault(e[5], []).append(e)
        if e[3] in logparse.MESSAGE_KINDS:
            groups.setdefault(e[4], []).append(("ev", e, e[1], e[2]))
    for evs in by_d.values():
        paired, _ = messages.pair_deliveries(evs)
        for (_h, n), item in paired:
            groups.setdefault(n, []).append(item)
    for n, item in snaps:
        groups.setdefault(n, []).append(item)
    ctx = ctx or messages.HostContext(log_start=T0, log_end=T0 + 1000, log_end_exiting=True)
    rows = []
    for n, items in groups.items():
        rows += messages.process_group("h", n, items, ctx)
    return rows


def _kinds(rows):
    return sorted(r[1][3] for r in rows if r[0] == "f")


def _log(*texts, start=T0, step=0.01):
    return ["%.6f %s" % (start + i * step, t) for i, t in enumerate(texts)]


CLEAN = ("new msg 5", "info msg 5: bytes 100 from <a@b> qp 9 uid 0",
         "starting delivery 1: msg 5 to local x@y", "delivery 1: success: did_1+0+0/",
         "end msg 5")


def test_a_clean_message_moves_only_through_legal_states():
    rows = _run(_log(*CLEAN))
    assert _kinds(rows) == []
    tr = [r[1] for r in rows if r[0] == "tr"]
    assert all(t[9] for t in tr)
    moves = [(t[6], t[7], t[8]) for t in tr]
    # qmail-queue's unlogged moves lead to new msg; qmail-clean's to the first delivery
    assert moves[0] == (messages.ABSENT, "S2>S3", states.S4)
    assert moves[2] == (states.S4, "", states.S5)
    assert moves[-1] == (states.S5, "", states.S1)
    assert all(states.path_exists(a, b) for a, _v, b in moves)


def test_illegal_moves_are_reported():
    rows = _run(_log(*CLEAN, "end msg 5"))
    assert _kinds(rows) == ["illegal-transition"]
    rows = _run(_log("new msg 5", "info msg 5: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 5 to local x@y", "delivery 1: success: ok/",
                     "info msg 5: bytes 1 from <a@b> qp 9 uid 0", "end msg 5"))
    assert _kinds(rows) == ["illegal-transition"]


def test_delivery_after_end_duplicate_and_unbounced_failure():
    rows = _run(_log(*CLEAN, "starting delivery 2: msg 5 to remote z@q",
                     "delivery 2: success: ok/"))
    assert _kinds(rows) == ["delivery-after-end"]
    rows = _run(_log("new msg 6", "info msg 6: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 6 to local x@y", "delivery 1: success: ok/",
                     "starting delivery 2: msg 6 to local x@y", "delivery 2: success: ok/",
                     "starting delivery 3: msg 6 to local w@y", "delivery 3: failure: no/",
                     "end msg 6"))
    assert _kinds(rows) == ["duplicate-delivery", "failure-not-bounced"]


def test_preprocessing_redone_is_legal_but_a_live_number_reused_is_not():
    rows = _run(_log("new msg 7", "new msg 7", "info msg 7: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 7 to local x@y", "delivery 1: success: ok/",
                     "end msg 7"))
    assert _kinds(rows) == []
    assert len([r for r in rows if r[0] == "occ"]) == 1
    rows = _run(_log("new msg 8", "info msg 8: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 8 to local x@y", "delivery 1: deferral: later/",
                     "new msg 8", "info msg 8: bytes 1 from <a@b> qp 9 uid 0", "end msg 8"))
    assert _kinds(rows) == ["illegal-transition"]


def test_lifetime_never_ended_and_snapshot_cross_checks():
    ctx = messages.HostContext(log_start=T0, log_end=T0 + 1000, log_end_exiting=True,
                               snapshots=(T0 + 2000,), queuelifetime=100, lifetime_slack=10)
    lines = _log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0",
                 "starting delivery 1: msg 9 to remote x@y", "delivery 1: deferral: later/")
    lines += _log("starting delivery 2: msg 9 to remote x@y", "delivery 2: deferral: later/",
                  start=T0 + 200)
    lines += _log(*CLEAN, start=T0 + 300)
    snap9 = (9, ("snap", (states.S5, T0, 1), T0 + 2000, None))
    rows = _run(lines, ctx, snaps=[snap9])
    assert _kinds(rows) == ["never-ended", "past-lifetime"]
    # without the snapshot entry the queued message vanished
    rows = _run(lines, ctx)
    assert _kinds(rows) == ["never-ended", "past-lifetime", "vanished"]
    # an ended message still in the snapshot is an illegal move back to S5
    snap5 = (5, ("snap", (states.S5, T0 + 300, 1), T0 + 2000, None))
    rows = _run(lines, ctx, snaps=[snap9, snap5])
    assert _kinds(rows) == ["illegal-transition", "never-ended", "past-lifetime"]


def test_qmailanalog_lines_follow_matchup():
    rows = _run(_log(*CLEAN))
    (m,) = [r[1] for r in rows if r[0] == "m"]
    (d,) = [r[1] for r in rows if r[0] == "d"]
    assert m[1:7] == (T0 + 0.01, T0 + 0.04, 100, 1, 0, 0)     # birth = info msg time
    assert d[3:7] == ("k", T0 + 0.01, T0 + 0.02, T0 + 0.03)
    # a result whose message is unknown keeps dstart as its birth, as matchup does
    rows = _run(_log("starting delivery 4: msg 3 to local q@r", "delivery 4: success: ok/"))
    (d,) = [r[1] for r in rows if r[0] == "d"]
    assert d[4] == d[5] == T0 and d[7] == 0


def test_log_lines_of_every_timestamp_style_parse_alike():
    text = "end msg 42"
    for style in ("epoch", "tai64n", "iso", "journald"):
        line = synthetic.prefix(style, 1795323135.653157, "mx9") + text
        parsed = logparse.parse_line("dir", 0, 0, line)
        assert parsed[0] == "end msg"
        assert abs(parsed[3] - 1795323135.653157) < 1e-6
        assert parsed[1] == ("mx9" if style == "journald" else "dir")


def test_bad_lines_are_classified():
    assert logparse.parse_line("h", 0, 0, "1795000000.1 delivery 5: succ")[1] == "truncated-line"
    assert logparse.parse_line("h", 0, 0, "1795000000.1 hello there")[1] == "unknown-line"
    assert logparse.parse_line("h", 0, 0, "end msg 5")[1] == "no-timestamp"


def test_snapshot_record_checks():
    taken = T0 + 10 * 86400

    def rec(n, kinds, mtime, recipients=(), problems=()):
        files = {k: {"path": k, "split": n % 23, "size": 1, "mtime": mtime, "atime": mtime,
                     "inode": n, "mode": 0o600, "links": 1} for k in kinds}
        return snapshot.message_record("h", n, "dir", files, "s", recipients, problems=problems)

    ok = rec(1, ["mess", "info", "remote"], taken - 100,
             [snapshot.recipient("remote", "a@b", False)])
    assert snapshots.check_record(ok, taken, 604800, 3600) == []
    kinds = lambda r: [f[1][3] for f in snapshots.check_record(r, taken, 604800, 3600)]
    assert kinds(rec(2, ["mess"], taken - 200000)) == ["stale-leftover"]
    assert kinds(rec(3, ["mess", "intd"], taken - 200000)) == ["stale-leftover"]
    assert kinds(rec(4, ["todo"], taken)) == ["files-disagree"]
    assert kinds(rec(5, ["mess", "info"], taken,
                     problems=["split-mismatch: info/7/5 is in split dir 7, expected 5"])) \
        == ["files-disagree"]
    old = rec(6, ["mess", "info", "remote"], taken - 8 * 86400,
              [snapshot.recipient("remote", "a@b", False)])
    assert kinds(old) == ["past-lifetime"]
    done = rec(7, ["mess", "info", "remote"], taken - 8 * 86400,
               [snapshot.recipient("remote", "a@b", True)])
    assert kinds(done) == []
    # the last pass of a 604800 s lifetime falls at (20 * 39)^2 s for both channels
    assert snapshots.last_attempt_offset("remote", 604800) == 608400
    assert snapshots.last_attempt_offset("local", 604800) == 608400


def test_segment_records_are_checked_against_the_record_table():
    class Rec:
        def __init__(self, kind, n, offset):
            self.kind, self.n, self.offset = kind, n, offset

    def read(data):
        return [Rec("ENVELOPE", 5, 0), Rec("PREPROCESSED", 5, 10), Rec("DELIVERY", 5, 20),
                Rec("FINISH", 5, 30), Rec("DELIVERY", 5, 40), Rec("TORN", None, 50)]

    rows = segments.records(read, "h", "seg1", b"")
    assert [r[1][3] for r in rows if r[0] == "f"] == ["segment-torn"]
    recs = [r[1][1] for r in rows if r[0] == "seg"]
    out = segments.process_segment_group("h", 5, recs)
    assert [r[1][3] for r in out if r[0] == "f"] == ["illegal-transition"]
    broken = segments.records(lambda data: iter([Rec("CORRUPT", None, 7)]), "h", "s", b"")
    assert [r[1][3] for r in broken] == ["segment-corrupt"]


def test_report_is_self_contained_svg():
    summary = {"qmailanalog": {"completed_messages": 1}, "messages": {
        "messages": 1, "numbers": 1, "ended": 1, "not_ended": 0, "bounces": 0,
        "triple_bounces": 0, "orphans": 0},
        "findings": {"violations": 1, "by_kind": {"vanished": 1}, "violation_examples": [
            {"kind": "vanished", "host": "h", "n": 1, "birth": 1.0, "time": 2.0,
             "detail": "<b>&"}]},
        "inputs": {"hosts": ["h"]}, "log": {"lines": 3, "by_kind": {"end msg": 1}},
        "delays": {}, "per_domain": [], "per_sender": [], "per_hour": [], "per_host": [],
        "bad_input": []}
    plots = {"queue": [(T0, 1), (T0 + 60, 0)], "delay_hist": [(0.0, 3)],
             "domains": [("x.example", 2, 1)], "findings": [("vanished", 1)]}
    html = report.render(summary, plots)
    assert html.count("<svg") == 4 and "&lt;b&gt;&amp;" in html
    assert "<script" not in html and "src=" not in html


def test_the_sample_log_parses_with_the_shared_parser():
    path = os.path.join(DATA, "qmail-send-sample.epoch.log")
    with open(path) as f:
        kinds = [logline.parse(line).kind for line in f]
    assert "unknown" not in kinds and len(kinds) == 2951
