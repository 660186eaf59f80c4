"""The audit's per-message logic without Spark: parsing, transition checks, snapshots."""
import pytest

from audit_support import groups_of
from qmailpy import logline, snapshot_format as snapshot, states
from shared_data import data_file
from qmailpy_audit import inputs, logparse, messages, report, segments, snapshots, synthetic

EPOCH = data_file("qmail-send-sample.epoch.log")
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
    groups = groups_of(events, snaps)
    restarts = messages.id_drops([(e[1], e[5]) for e in events if e[3] == "start"])
    ctx = ctx or messages.HostContext(log_start=T0, log_end=T0 + 1000, log_end_exiting=True,
                                      restarts=restarts)
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
    # x@y delivered, then again after qmail-send restarted (delivery ids begin at 1 again)
    rows = _run(_log("new msg 6", "info msg 6: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 6 to local x@y", "delivery 1: success: ok/",
                     "starting delivery 2: msg 6 to local w@y", "delivery 2: failure: no/",
                     "status: local 0/10 remote 0/20",
                     "starting delivery 1: msg 6 to local x@y", "delivery 1: success: ok/",
                     "end msg 6"))
    assert _kinds(rows) == ["duplicate-delivery", "failure-not-bounced"]


def test_an_address_listed_twice_is_delivered_twice_in_one_run():
    rows = _run(_log("new msg 6", "info msg 6: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 6 to local x@y", "delivery 1: success: ok/",
                     "starting delivery 2: msg 6 to local x@y", "delivery 2: success: ok/",
                     "end msg 6"))
    assert _kinds(rows) == []


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


def test_held_and_deleted_messages_are_not_violations():
    """qmailctl queue's lines (docs/qmail-send.md "Commands"): hold and release move S5 <->
    HELD, delete ends a message (S5 or HELD -> S1) without end msg, a failure included."""
    head = ("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0",
            "starting delivery 1: msg 9 to remote x@y", "delivery 1: failure: no/")
    rows = _run(_log(*head, "hold msg 9", "delete msg 9"))
    assert _kinds(rows) == []
    moves = [(t[1][6], t[1][8], t[1][9]) for t in rows if t[0] == "tr"][-2:]
    assert moves == [(states.S5, states.HELD, True), (states.HELD, states.S1, True)]
    occ = [r[1] for r in rows if r[0] == "occ"][0]
    assert occ[9] is True and occ[-1] == states.S1          # ended, in S1
    rows = _run(_log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0", "hold msg 9",
                     "release msg 9", "requeue msg 9", "bounce now msg 9: gone_away",
                     "bounce msg 9 qp 12", "end msg 9"))
    assert _kinds(rows) == []
    rows = _run(_log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0", "hold msg 9"))
    assert _kinds(rows) == ["never-ended"]                    # a notice: still held
    # what a command cannot do: release a message that is not held, act after delete
    rows = _run(_log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0", "release msg 9",
                     "end msg 9"))
    assert _kinds(rows) == ["illegal-transition"]
    rows = _run(_log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0", "delete msg 9",
                     "starting delivery 1: msg 9 to local x@y", "delivery 1: success: ok/"))
    assert _kinds(rows) == ["delivery-after-end"]


def test_a_queued_message_set_aside_or_deleted_moves_s4_to_s1():
    """A message qmail-send never preprocessed (docs/qmail-send.md "Messages set aside"), or
    one qmailctl deleted while qmail-send was down, is deleted from S4, not from S5."""
    rows = _run(_log("warning: msg 9: set aside: too big", "warning: msg 9: set aside: too big",
                     "delete msg 9"))
    assert _kinds(rows) == []
    moves = [(t[1][5], t[1][6], t[1][8], t[1][9]) for t in rows if t[0] == "tr"]
    assert moves == [("set aside", None, states.S4, True), ("set aside", states.S4, states.S4, True),
                     ("delete msg", states.S4, states.S1, True)]
    # a new message on the number of one that ended, deleted before preprocessing
    rows = _run(_log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0", "end msg 9",
                     "delete msg 9", "warning: msg 9: set aside: too big", "delete msg 9"))
    assert _kinds(rows) == []
    moves = [(t[1][5], t[1][6], t[1][8], t[1][9]) for t in rows if t[0] == "tr"][-3:]
    assert moves == [("delete msg", states.S4, states.S1, True), ("set aside", states.S4, states.S4, True),
                     ("delete msg", states.S4, states.S1, True)]
    occs = [r[1] for r in rows if r[0] == "occ"]
    assert [(o[9], o[-1]) for o in occs] == [(True, states.S1)] * 3
    # a preprocessed message is never set aside
    rows = _run(_log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0",
                     "starting delivery 1: msg 9 to remote x@y", "delivery 1: deferral: later/",
                     "warning: msg 9: set aside: too big", "delete msg 9"))
    assert _kinds(rows) == ["illegal-transition"]


def test_lifetime_never_ended_and_snapshot_cross_checks():
    # queuelifetime 100: remote passes at 0, 400 (dying), ...; grace 10 s
    ctx = messages.HostContext(log_start=T0, log_end=T0 + 2000, log_end_exiting=True,
                               snapshots=(T0 + 2500,), queuelifetime=100, lifetime_slack=10)
    lines = _log("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0",
                 "starting delivery 1: msg 9 to remote x@y", "delivery 1: deferral: later/")
    # a deferral past the dying pass, then the log runs on past the next pass
    lines += _log("starting delivery 2: msg 9 to remote x@y", "delivery 2: deferral: later/",
                  start=T0 + 500)
    lines += _log(*CLEAN, start=T0 + 600)
    snap9 = (9, ("snap", (states.S5, T0, 1), T0 + 2500, None))
    rows = _run(lines, ctx, snaps=[snap9])
    assert _kinds(rows) == ["never-ended", "past-lifetime"]
    (detail,) = [r[1][6] for r in rows if r[0] == "f" and r[1][3] == "past-lifetime"]
    assert "started 500 s after birth, past the last scheduled pass at 400 s" in detail
    # without the snapshot entry the queued message vanished
    rows = _run(lines, ctx)
    assert _kinds(rows) == ["never-ended", "past-lifetime", "vanished"]
    # an ended message still in the snapshot is an illegal move back to S5
    snap5 = (5, ("snap", (states.S5, T0 + 600, 1), T0 + 2500, None))
    rows = _run(lines, ctx, snaps=[snap9, snap5])
    assert _kinds(rows) == ["illegal-transition", "never-ended", "past-lifetime"]
    # the log ends before the pass after the late deferral is due: nothing to judge yet
    early = messages.HostContext(log_start=T0, log_end=T0 + 1000, log_end_exiting=True,
                                 queuelifetime=100, lifetime_slack=10)
    assert _kinds(_run(lines, early)) == ["never-ended"]


LIFE = messages.HostContext(log_start=T0, log_end=T0 + 5000, log_end_exiting=True,
                            queuelifetime=100, lifetime_slack=10)
BORN = ("new msg 9", "info msg 9: bytes 1 from <a@b> qp 9 uid 0",
        "starting delivery 1: msg 9 to remote x@y", "delivery 1: deferral: later/")
DYING = "delivery 2: failure: I'm_not_going_to_try_again;_this_message_has_been_in_the_" \
        "queue_too_long./"


def test_expired_then_bounced_is_how_qmail_ends_a_message():
    for dying_at in (400, 401, 3000):      # on time, a little late, qmail-send was down
        lines = _log(*BORN) + _log("starting delivery 2: msg 9 to remote x@y", DYING,
                                   "bounce msg 9 qp 10", "end msg 9", start=T0 + dying_at)
        assert _kinds(_run(lines, LIFE)) == [], dying_at
    # a deferral past the last pass is forgiven when the dying failure and bounce follow
    lines = _log(*BORN) + _log("starting delivery 2: msg 9 to remote x@y",
                               "delivery 2: deferral: later/", start=T0 + 500) \
        + _log("starting delivery 3: msg 9 to remote x@y", DYING.replace("2:", "3:"),
               "bounce msg 9 qp 10", "end msg 9", start=T0 + 1800)
    assert _kinds(_run(lines, LIFE)) == []


def test_past_lifetime_in_the_log():
    # deferred past the dying pass, then delivered: it should have bounced
    late = _log(*BORN) + _log("starting delivery 2: msg 9 to remote x@y",
                              "delivery 2: deferral: later/", start=T0 + 500) \
        + _log("starting delivery 3: msg 9 to remote x@y", "delivery 3: success: ok/",
               "end msg 9", start=T0 + 1800)
    rows = _run(late, LIFE)
    assert _kinds(rows) == ["past-lifetime"]
    (f,) = [r[1] for r in rows if r[0] == "f"]
    assert f[5] == T0 + 1800 + 0.02 and "ended without the failure and bounce" in f[6]
    # a deferral inside the lifetime is no finding, however late the success
    early = _log(*BORN) + _log("starting delivery 2: msg 9 to remote x@y",
                               "delivery 2: deferral: later/", start=T0 + 90) \
        + _log("starting delivery 3: msg 9 to remote x@y", "delivery 3: success: ok/",
               "end msg 9", start=T0 + 400)
    assert _kinds(_run(early, LIFE)) == []
    # with queuelifetime 50 the local channel's dying pass is at 100 s, the remote one's
    # at 400 s: a deferral at 150 s is late for local only
    short = messages.HostContext(log_start=T0, log_end=T0 + 5000, log_end_exiting=True,
                                 queuelifetime=50, lifetime_slack=10)
    at150 = _log(*BORN) + _log("starting delivery 2: msg 9 to remote x@y",
                               "delivery 2: deferral: later/", start=T0 + 150) \
        + _log("starting delivery 3: msg 9 to remote x@y", "delivery 3: success: ok/",
               "end msg 9", start=T0 + 600)
    assert _kinds(_run(at150, short)) == []
    local = [line.replace("remote", "local") for line in at150]
    assert _kinds(_run(local, short)) == ["past-lifetime"]
    # tried again after the dying pass had failed the channel
    again = _log(*BORN) + _log("starting delivery 2: msg 9 to remote x@y", DYING,
                               start=T0 + 400) \
        + _log("starting delivery 3: msg 9 to remote z@y", "delivery 3: success: ok/",
               "bounce msg 9 qp 10", "end msg 9", start=T0 + 1600)
    rows = _run(again, LIFE)
    assert _kinds(rows) == ["past-lifetime"]
    assert "remote z@y tried again (delivery 3)" in [r[1][6] for r in rows if r[0] == "f"][0]


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


def test_gzip_logs_are_sniffed_and_read_by_their_text():
    import gzip
    text = "".join("1795000000.%06d new msg %d\n" % (i, i) for i in range(5000))
    data = gzip.compress(text.encode())
    assert data[:2] == inputs.GZIP_MAGIC and b"\0" in data[:inputs.HEAD_BYTES]
    head = inputs.gunzip_head(data[:inputs.GZIP_HEAD_BYTES])
    assert head.startswith(b"1795000000.000000 new msg 0\n") and len(head) <= inputs.HEAD_BYTES
    assert inputs.sniff(head) == "log"
    lines = list(inputs.gzip_lines(data))
    assert lines[0] == (0, "1795000000.000000 new msg 0") and lines[-1][0] == 4999
    snap = gzip.compress(b'{"record": "snapshot"}\r\n')
    assert inputs.sniff(inputs.gunzip_head(snap)) == "snapshot"
    assert list(inputs.gzip_lines(snap)) == [(0, '{"record": "snapshot"}')]


def test_journalctl_framing_lines_are_ignored_not_bad():
    for marker in ("-- No entries --", "-- Boot 3f2a9c0d4e5b46a7b8c9d0e1f2a3b4c5 --",
                   "-- Logs begin at Mon 2026-11-16 08:00:01 UTC, end at Sun 2026-11-22 "
                   "10:12:14 UTC. --", "-- Journal begins at Mon 2026-11-16 08:00:01 UTC. --",
                   "-- Reboot --"):
        assert logparse.parse_line("h", 0, 0, marker) == ("ignored", "journald-marker"), marker
    # only journalctl's own words: anything else between dashes is still unknown
    assert logparse.parse_line("h", 0, 0, "-- hello --")[:2] == ("bad", "unknown-line")


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


@pytest.mark.skipif(EPOCH is None, reason="shared/data fixtures not found")
def test_the_sample_log_parses_with_the_shared_parser():
    with open(EPOCH) as f:
        kinds = [logline.parse(line).kind for line in f]
    assert "unknown" not in kinds and len(kinds) == 2951
