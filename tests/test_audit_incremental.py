"""qmail-audit --incremental (issue 26 point 4): runs that read only what is new.

A log audited piece by piece - cut mid-line and mid-message, bytes appended, the file
rotated by multilog - and a fleet audited twice must give the summaries.json and the
findings of one run over everything; a run SIGKILLed before its commit is redone by the
next without counting anything twice; a commit fsyncs what it names before its rename; a
second run on the same OUT is refused; a damaged state is bad input, told before Spark
starts; a run with nothing new changes nothing.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("pyspark")

from qmailpy_audit import fleet, incremental, job, synthetic  # noqa: E402

AUDIT = os.path.join(os.path.dirname(sys.executable), "qmail-audit")
DEFECTS = {"never-ended": 1, "failure-not-bounced": 1, "duplicate-delivery": 1,
           "past-lifetime": 1, "illegal-transition": 1}
ROTATED = "@4000000069f5f1a2000000000.s"


@pytest.fixture(scope="module")
def spark():
    from qmailpy.cli.qmail_audit import session
    s = session("local[2]", "qmail-audit-incremental-tests")
    yield s
    s.stop()


def audit(spark, inputs, out, **kw):
    opts = job.Options(queuelifetime=synthetic.LIFETIME, lifetime_slack=synthetic.SLACK, **kw)
    opts.incremental = True
    return job.audit(spark, [str(i) for i in inputs], str(out), opts)


def findings(out):
    rows = []
    top = os.path.join(out, "findings.json")
    for name in sorted(os.listdir(top)):
        if name.startswith("part-"):
            with open(os.path.join(top, name)) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def summary(out):
    with open(os.path.join(out, "summaries.json")) as f:
        found = json.load(f)
    found.pop("incremental")
    return found


def assert_close(a, b, where="summary"):
    """Equal, floats to 1e-9 relative (sums taken in another order)."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (where, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), (where, sorted(a), sorted(b))
        for k in a:
            assert_close(a[k], b[k], where + "." + k)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, "%s[%d]" % (where, i))
    else:
        assert a == b, (where, a, b)


def assert_same_audit(pieces_out, whole_out):
    assert_close(summary(pieces_out), summary(whole_out))
    assert findings(pieces_out) == findings(whole_out)


def mid_line(data, fraction):
    """A byte offset inside a line near fraction of data."""
    return data.index(b"\n", int(len(data) * fraction)) - 7


# --- one host's log: cut mid-line, appended, rotated -----------------------------------------

@pytest.fixture(scope="module")
def pieces(spark, tmp_path_factory):
    """mx1's log audited in three runs into OUT/pieces: the first third (ending mid-line),
    then bytes appended up to two thirds (mid-line again), then multilog's rotation: the
    file renamed @TAI64N.s, whole, and a new `current` with the rest; and the same final
    files audited by one run into OUT/whole."""
    top = tmp_path_factory.mktemp("pieces")
    data_dir = top / "in" / "mx1"
    data_dir.mkdir(parents=True)
    whole_log = top / "whole.log"
    snapshot = top / "in" / "mx1.snapshot"
    synthetic.generate(str(whole_log), messages=240, seed=26, host="mx1", defects=DEFECTS,
                       snapshot_path=str(top / "snapshot"))
    data = whole_log.read_bytes()
    first, second = mid_line(data, 0.33), mid_line(data, 0.66)
    rotate_at = data.index(b"\n", second) + 1
    current = data_dir / "current"
    runs = []
    current.write_bytes(data[:first])
    runs.append(audit(spark, [top / "in"], top / "pieces"))
    with open(current, "ab") as f:
        f.write(data[first:second])
    runs.append(audit(spark, [top / "in"], top / "pieces"))
    with open(current, "ab") as f:
        f.write(data[second:rotate_at])
    os.rename(current, data_dir / ROTATED)
    current.write_bytes(data[rotate_at:])
    shutil.copy(top / "snapshot", snapshot)
    started = time.monotonic()
    runs.append(audit(spark, [top / "in"], top / "pieces"))
    third = time.monotonic() - started
    started = time.monotonic()
    whole = audit(spark, [top / "in"], top / "whole")
    return {"top": top, "runs": runs, "whole": whole, "lines": data.count(b"\n"),
            "cuts": (data[:first].count(b"\n"), data[:second].count(b"\n")),
            "times": (third, time.monotonic() - started)}


def test_a_log_audited_in_pieces_equals_one_run(pieces):
    top = pieces["top"]
    assert_same_audit(top / "pieces", top / "whole")
    kinds = pieces["whole"].findings_by_kind
    for kind in ("never-ended", "failure-not-bounced", "duplicate-delivery", "past-lifetime"):
        assert kinds.get(kind), kinds        # the defects are there to be found, in both
    assert summary(top / "whole")["log"]["lines"] if "lines" in summary(top / "whole")["log"] \
        else True


def test_each_run_reads_only_the_new_whole_lines(pieces):
    read = [r.summary["incremental"]["lines_read"] for r in pieces["runs"]]
    one, two = pieces["cuts"]
    # a line cut in two is read once, whole, by the run after the cut
    assert read == [one, two - one, pieces["lines"] - two]
    assert pieces["whole"].summary["incremental"]["lines_read"] == pieces["lines"]
    with open(top_state(pieces)) as f:
        state = json.load(f)
    files = {os.path.basename(r["path"]): r for r in state["files"]}
    assert files[ROTATED]["rank"] == 0 and files["current"]["rank"] == 1
    assert state["runs"] == ["000001", "000002", "000003"]


def top_state(pieces):
    return pieces["top"] / "pieces" / incremental.STATE


def test_a_run_with_nothing_new_changes_nothing(spark, pieces):
    out = pieces["top"] / "pieces"
    before = {p: (out / p).read_bytes() for p in (incremental.STATE, "summaries.json",
                                                  "report.html")}
    runs_before = sorted(os.listdir(out / incremental.RUNS))
    started = time.monotonic()
    again = audit(spark, [pieces["top"] / "in"], out)
    took = time.monotonic() - started       # printed, not asserted: a figure, not a test
    print("nothing new: %.1f s; the last run with new lines: %.1f s; one run over all: %.1f s"
          % ((took,) + pieces["times"]))
    assert {p: (out / p).read_bytes() for p in before} == before
    assert sorted(os.listdir(out / incremental.RUNS)) == runs_before
    assert again.findings_by_kind == pieces["runs"][-1].findings_by_kind


def test_a_report_older_than_the_state_is_made_again(spark, pieces, tmp_path):
    """A run killed after its commit and before its report left summaries.json of the run
    before: a later run with nothing new makes the report again instead of serving that."""
    out = tmp_path / "out"
    shutil.copytree(pieces["top"] / "pieces", out)
    current = json.loads((out / "summaries.json").read_text())
    stale = dict(current, incremental=dict(current["incremental"],
                                           run=current["incremental"]["run"] - 1),
                 findings=dict(current["findings"], by_kind={}, violations=0))
    (out / "summaries.json").write_text(json.dumps(stale))
    again = audit(spark, [pieces["top"] / "in"], out)
    made = json.loads((out / "summaries.json").read_text())
    assert made["incremental"]["run"] > current["incremental"]["run"]     # a run of its own
    assert made["findings"]["by_kind"] == current["findings"]["by_kind"] != {}
    assert again.findings_by_kind == current["findings"]["by_kind"]


def _record(path, head, **kw):
    rec = {"host": "mx", "kind": "log", "path": path, "rank": 0, "offset": len(head),
           "lines": head.count(b"\n"), "head_len": len(head), "hash": incremental._hash(head),
           "gzip": False}
    rec.update(kw)
    return rec


def test_a_file_record_is_continued_by_one_file_and_never_by_an_empty_start():
    """Which earlier file a log file continues (no Spark): an empty file's record, whose
    empty first bytes match anything, continues nothing; one record is given to one file
    per run; of two records that match, the one that matches more of the file's start."""
    class Shipped:
        def __init__(self, path):
            self.host, self.kind, self.path = "mx", "log", path

    empty = _record("current", b"")
    short = _record("old/current", b"@4000 new msg 1\n")
    longer = _record("@1.s", b"@4000 new msg 1\n@4001 info msg 1\n")
    run = incremental.Run.__new__(incremental.Run)
    run.state = {"files": [empty, short, longer]}
    head = b"@4000 new msg 1\n@4001 info msg 1\n@4002 end msg 1\n"
    assert run._match(Shipped("current"), head, set()) is longer
    assert run._match(Shipped("current"), head, {id(longer)}) is short
    assert run._match(Shipped("current"), head, {id(longer), id(short)}) is None
    assert run._match(Shipped("current"), b"@4100 new msg 2\n", set()) is None


def test_a_damaged_state_is_bad_input_before_spark_starts(pieces, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(pieces["top"] / "pieces", out)
    final = out / incremental.RUNS / "000001" / "final" / "messages.parquet"
    part = sorted(p for p in os.listdir(final) if p.startswith("part-"))[0]
    with open(final / part, "r+b") as f:
        f.truncate(os.path.getsize(final / part) // 2)
    state_before = (out / incremental.STATE).read_bytes()
    done = subprocess.run([AUDIT, "--incremental", "--out", str(out), str(pieces["top"] / "in")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "qmail-audit: bad state: %s is" % (final / part) in done.stderr
    assert "rerun with --full" in done.stderr
    assert "Spark" not in done.stderr           # told before a session was started
    assert (out / incremental.STATE).read_bytes() == state_before
    (out / incremental.STATE).write_text('{"format": 1, "runs": ["0000')
    done = subprocess.run([AUDIT, "--incremental", "--out", str(out), str(pieces["top"] / "in")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is unreadable" in done.stderr, done.stderr


COMMIT = """
import sys
from qmailpy_audit import incremental
run = incremental.Run(sys.argv[1])
incremental.shutil.copytree(sys.argv[2], run.dir)     # a run's tables, as Spark wrote them
run.commit([])
"""


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
def test_a_commit_syncs_what_it_names_before_its_rename_and_the_rename_after(pieces, tmp_path):
    """The fsyncs and the rename of a commit (strace, no Spark in the traced process): every
    file state.json names for the run, each directory from it up to OUT, and state.json.new
    before the rename; OUT after it. Else a power cut could keep a state naming lost files."""
    out = tmp_path / "out"
    shutil.copytree(pieces["top"] / "pieces", out)
    trace = tmp_path / "trace"
    done = subprocess.run(["strace", "-qq", "-y", "-o", str(trace), "-e",
                           "trace=fsync,fdatasync,rename,renameat,renameat2", sys.executable,
                           "-c", COMMIT, str(out), str(out / incremental.RUNS / "000003")],
                          capture_output=True, text=True, timeout=120)
    if "ptrace" in done.stderr:
        pytest.skip("strace cannot trace here: %s" % done.stderr)
    assert done.returncode == 0, done.stderr
    top = os.path.realpath(out)
    state_path = os.path.join(top, incremental.STATE)
    calls = []
    for line in trace.read_text().splitlines():
        m = re.match(r'f(?:data)?sync\(\d+<(.*)>\)\s+= 0$', line)
        if m:
            calls.append(("sync", m.group(1)))
        elif re.match(r'rename(?:at2?)?\(.*/%s"' % re.escape(incremental.STATE), line):
            calls.append(("rename", line))
    renames = [i for i, c in enumerate(calls) if c[0] == "rename"]
    assert len(renames) == 1 and "= 0" in calls[renames[0]][1], calls
    before = {p for kind, p in calls[:renames[0]] if kind == "sync"}
    after = {p for kind, p in calls[renames[0]:] if kind == "sync"}
    with open(state_path) as f:
        named = [rel for rel in json.load(f)["sizes"] if rel.startswith("runs/000004/")]
    assert any("/final/" in rel for rel in named) and any("carried" in rel for rel in named)
    needed = {state_path + ".new"}
    for rel in named:
        path = os.path.join(top, rel)
        while path != os.path.dirname(top):
            needed.add(path)
            path = os.path.dirname(path)
    assert needed - before == set()
    assert top in after


def test_a_second_run_on_the_same_out_is_refused(tmp_path):
    """While a run holds OUT's lock another exits 2, saying so, before Spark starts; the
    holder's pid is named. A cron job overlapping the last run's tail skips its turn."""
    out = tmp_path / "out"
    held = incremental.lock(str(out))
    try:
        done = subprocess.run([AUDIT, "--incremental", "--out", str(out), str(tmp_path / "in")],
                              capture_output=True, text=True, timeout=120)
    finally:
        os.close(held)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "qmail-audit: %s is in use by another run (pid %d); nothing was read " \
        "or counted\n" % (out, os.getpid())
    assert sorted(os.listdir(out)) == [incremental.LOCK]


# --- a fleet, twice; a run killed before its commit ------------------------------------------

@pytest.fixture(scope="module")
def fleet_runs(spark, tmp_path_factory):
    """Three hosts handing mail on (generate_fleet), audited with --fleet: first with each
    host's log cut mid-line at 55%, then whole, into OUT/twice; one run over all into
    OUT/once; OUT/after-first holds the state of the first run alone."""
    top = tmp_path_factory.mktemp("fleet")
    source = top / "source"
    map_text, _expects = synthetic.generate_fleet(str(source), hosts=3, messages=120, seed=7)
    (top / "fleet.map").write_text(map_text)
    fleet_map = fleet.read_map(str(top / "fleet.map"))
    inputs = top / "in"
    whole = {}
    for host in sorted(os.listdir(source)):
        whole[host] = (source / host / "current").read_bytes()
        (inputs / host).mkdir(parents=True)
        (inputs / host / "current").write_bytes(whole[host][:mid_line(whole[host], 0.55)])
    every_host = str(inputs / "*")       # a glob: each host's directory an input of its own
    first = audit(spark, [every_host], top / "twice", fleet_map=fleet_map)
    shutil.copytree(top / "twice", top / "after-first")
    for host, data in whole.items():
        (inputs / host / "current").write_bytes(data)
    second = audit(spark, [every_host], top / "twice", fleet_map=fleet_map)
    once = audit(spark, [every_host], top / "once", fleet_map=fleet_map)
    return {"top": top, "inputs": every_host, "map": top / "fleet.map", "fleet_map": fleet_map,
            "first": first, "second": second, "once": once,
            "lines": sum(d.count(b"\n") for d in whole.values())}


def test_a_fleet_audited_twice_equals_once(fleet_runs):
    top = fleet_runs["top"]
    assert_same_audit(top / "twice", top / "once")
    once = fleet_runs["once"].summary
    assert once["inputs"]["hosts"] == ["h1", "h2", "h3"]
    assert once["fleet"]["journeys"]
    assert fleet_runs["first"].summary["incremental"]["lines_read"] \
        + fleet_runs["second"].summary["incremental"]["lines_read"] == fleet_runs["lines"]


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
def test_a_run_killed_before_its_commit_is_redone(spark, fleet_runs):
    """SIGKILLed by strace as it opens state.json.new, its tables written and synced."""
    top = fleet_runs["top"]
    out = top / "after-first"
    state_before = (out / incremental.STATE).read_bytes()
    trace = top / "killed.trace"
    killed = subprocess.run(["strace", "-qq", "-o", str(trace), "-P",
                             str(out / (incremental.STATE + ".new")), "-e", "trace=openat",
                             "-e", "inject=openat:signal=KILL",
                             AUDIT, "--incremental", "--master", "local[2]", "--driver-memory",
                             "1g", "--queuelifetime", str(synthetic.LIFETIME),
                             "--lifetime-slack", str(synthetic.SLACK),
                             "--fleet", str(fleet_runs["map"]), "--out", str(out),
                             fleet_runs["inputs"]],
                            capture_output=True, text=True, timeout=1800)
    if "ptrace" in killed.stderr:
        pytest.skip("strace cannot trace here: %s" % killed.stderr)
    assert killed.returncode == -9, killed.stderr
    assert trace.read_text().endswith("+++ killed by SIGKILL +++\n")
    # its tables were written; the state still names the first run alone; no lock is left
    assert (out / incremental.RUNS / "000002" / "carried.parquet").is_dir()
    assert (out / incremental.STATE).read_bytes() == state_before
    os.close(incremental.lock(str(out)))
    redone = audit(spark, [fleet_runs["inputs"]], out, fleet_map=fleet_runs["fleet_map"])
    assert redone.summary["incremental"]["run"] == 2
    assert redone.summary["incremental"]["lines_read"] \
        == fleet_runs["second"].summary["incremental"]["lines_read"]
    assert_same_audit(out, top / "once")
