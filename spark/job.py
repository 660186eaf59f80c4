"""The audit job: inputs -> per-message transition tables -> findings, summaries, report.

audit(spark, specs, out_dir, options) runs everything on the given SparkSession
and returns an AuditResult; the exit status is decided by AuditResult.exit_code
(0 clean, 1 violations, 2 bad input). The command line lives in
qmailpy/cli/qmail_audit.py, which spark-submit can also run as a file.
"""
import json
import os

from pyspark import StorageLevel
from pyspark.sql import functions as F
from pyspark.sql import types as T

from qmailpy import snapshot_format
from qmailpy.backends import snapshot as home_snapshot
from qmailpy.logfiles import QMQPD_LOG, SEND_LOG, log_set
from qmailpy.states import DEFAULT_QUEUELIFETIME
from qmailpy_audit import inputs as inputs_mod
from qmailpy_audit import fleet as fleet_mod
from qmailpy_audit import fleetqueue, where as where_mod
from qmailpy_audit import incremental
from qmailpy_audit import logparse, logsql, messages, msgsql, segments, snapshots, summaries, \
    report

EXAMPLES_PER_KIND = 20


class Options:
    def __init__(self, host_map=(), queuelifetime=DEFAULT_QUEUELIFETIME, lifetime_slack=3600.0,
                 write_parquet=True, home_snapshot_dir=None, fleet_map=None,
                 skew=fleet_mod.DEFAULT_SKEW, parser="python"):
        self.host_map = list(host_map)
        self.parser = parser              # "python": each line parsed in Python; "sql": in the JVM
        self.fleet_map = fleet_map        # {address: host} from --fleet MAP, or None
        self.skew = skew
        self.where = None                 # (key, value) of --where KEY=VALUE, or None
        self.queuelifetime = queuelifetime
        self.lifetime_slack = lifetime_slack
        self.write_parquet = write_parquet
        self.home_snapshot_dir = home_snapshot_dir
        self.incremental = False          # read only what is new since the state in out_dir
        self.full = False                 # with incremental: start over, replacing the state


class AuditResult:
    def __init__(self, summary, findings_by_kind, violations, bad_inputs, out_dir):
        self.summary = summary
        self.findings_by_kind = findings_by_kind
        self.violations = violations
        self.bad_inputs = bad_inputs
        self.out_dir = out_dir
        self.where = None                 # what --where found (spark/where.py answer())
        self.checked_in_jvm = 0           # --parser=sql: messages msgsql checked

    @property
    def warnings(self):
        return self.summary.get("warnings", [])

    @property
    def bad_count(self):
        return sum(b["count"] for b in self.bad_inputs)

    @property
    def exit_code(self):
        if self.bad_count:
            return 2
        return 1 if self.violations else 0


def _schema(fields, types):
    return T.StructType([T.StructField(name, types[name], True) for name in fields])


_L, _D, _S, _B = T.LongType(), T.DoubleType(), T.StringType(), T.BooleanType()
FIELD_TYPES = {
    "host": _S, "n": _L, "birth": _D, "info_time": _D, "bytes": _L, "sender": _S, "qp": _L,
    "uid": _L, "end_time": _D, "ended": _B, "orphan": _B, "attempts": _L, "successes": _L,
    "failures": _L, "deferrals": _L, "bounced": _L, "triple": _L, "last_state": _S,
    "seq": _L, "time": _D, "event": _S, "from_state": _S, "to_state": _S, "legal": _B,
    "done": _D, "nk": _L, "nd": _L, "nz": _L, "occ_birth": _D, "result": _S, "dstart": _D,
    "ddone": _D, "channel": _S, "recipient": _S, "domain": _S, "reason": _S, "kind": _S,
    "severity": _S, "detail": _S, "via": _S,
}
SCHEMAS = {
    "occ": _schema(messages.OCC_FIELDS, FIELD_TYPES),
    "tr": _schema(messages.TRANSITION_FIELDS, FIELD_TYPES),
    "m": _schema(messages.MLINE_FIELDS, FIELD_TYPES),
    "d": _schema(messages.DLINE_FIELDS, FIELD_TYPES),
    "f": _schema(messages.FINDING_FIELDS, FIELD_TYPES),
}


# --- reading ------------------------------------------------------------------

def _parse_partition(rows):
    counts = {}
    hosts = {}
    for host, rank, index, line in rows:
        parsed = logparse.parse_line(host, rank, index, line)
        if parsed[0] == "bad":
            key = "bad:" + parsed[1]
            counts[key] = counts.get(key, 0) + 1
            yield ("b", parsed[1:])
            continue
        if parsed[0] == "ignored":
            key = "ignored:" + parsed[1]
            counts[key] = counts.get(key, 0) + 1
            continue
        kind, host, seq, when, event = parsed
        counts[kind] = counts.get(kind, 0) + 1
        span = hosts.get(host)
        if span is None:
            hosts[host] = [when, seq, when, kind]
        else:
            if when < span[0]:
                span[0] = when
            if seq > span[1]:
                span[1], span[2], span[3] = seq, when, kind
        if event is not None:
            yield ("e", event)
    yield ("k", counts)
    for host, span in hosts.items():
        yield ("h", host, span)


def _numbered(host, rank):
    """Lines of one partition as (host, rank, index, line); index orders the whole file."""
    def number(part, lines):
        base = part << logparse.PART_SHIFT
        for i, line in enumerate(lines):
            yield host, rank, base | i, line
    return number


def _text(sc, f):
    """(index, line) of one text input; a gzip file is decompressed whatever its name."""
    if f.gzip:
        return sc.binaryFiles(f.path).flatMap(lambda pd: inputs_mod.gzip_lines(pd[1]))
    return sc.textFile(f.path).zipWithIndex().map(lambda li: (li[1], li[0]))


def _log_text(sc, files, f):
    """The lines of plain log file f, one of files: in one partition per block when the
    files are at least as many as the cores (a fleet's small per-host logs: fewer tasks in
    every stage after), else at least as many partitions in all as cores."""
    return sc.textFile(f.path, max(1, -(-sc.defaultParallelism // len(files))))


def _read_logs(sc, files, rows=None):
    if rows is not None:        # (host, rank, index, line) already read (incremental)
        return rows.mapPartitions(_parse_partition)
    rdds = []
    for rank, f in enumerate(files):
        if f.gzip:      # one partition: line index = position in the file
            rdds.append(_text(sc, f).map(lambda il, h=f.host, r=rank: (h, r, il[0], il[1])))
            continue
        rdds.append(_log_text(sc, files, f).mapPartitionsWithIndex(_numbered(f.host, rank)))
    if not rdds:
        return None
    return sc.union(rdds).mapPartitions(_parse_partition)


def _logs_python(sc, log_files, persisted, rows=None):
    """(line counts, host spans, event RDD or None, examples(limit)) with every line
    parsed in Python (--parser=python); rows: the lines to parse, when already read."""
    parsed = _read_logs(sc, log_files, rows)
    line_counts, spans = {}, {}
    if parsed is None:
        return line_counts, spans, None, lambda limit: []
    parsed.persist(StorageLevel.MEMORY_AND_DISK)
    persisted.append(parsed)
    for tag_row in parsed.filter(lambda t: t[0] in ("k", "h")).collect():
        if tag_row[0] == "k":
            for k, v in tag_row[1].items():
                line_counts[k] = line_counts.get(k, 0) + v
        else:
            host, span = tag_row[1], tag_row[2]
            old = spans.get(host)
            if old is None:
                spans[host] = list(span)
            else:
                old[0] = min(old[0], span[0])
                if span[1] > old[1]:
                    old[1:] = span[1:]

    def examples(limit):
        found = parsed.filter(lambda t: t[0] == "b").map(lambda t: t[1]).take(limit)
        parts = {}
        for rank in {e[2] for e in found if e[3] >> logparse.PART_SHIFT}:
            parts.update(_log_text(sc, log_files, log_files[rank]).mapPartitionsWithIndex(
                lambda i, it, r=rank: [((r, i), sum(1 for _ in it))]).collect())
        return [e[:3] + (logsql.line_index(e[2], e[3], parts),) + e[4:] for e in found]
    return line_counts, spans, parsed.filter(lambda t: t[0] == "e").map(lambda t: t[1]), \
        examples


def _logs_sql(spark, log_files, persisted, rows=None):
    """_logs_python's results, and the parsed lines' frame, with the lines parsed and
    counted in the JVM by Spark SQL (--parser=sql): Python sees only the events of messages
    (the frame pairs delivery results with their starts)."""
    if rows is not None:        # (host, rank, index, line) already read (incremental)
        parsed = logsql.lines(spark.createDataFrame(rows, logsql._TEXT_SCHEMA))
    else:
        parsed = logsql.read(spark, log_files, lambda f: _text(spark.sparkContext, f))
    if parsed is None:
        return {}, {}, None, lambda limit: [], None
    parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    persisted.append(parsed)
    line_counts, spans, parts = logsql.tallies(parsed)

    def examples(limit):
        return [e[:3] + (logsql.line_index(e[2], e[3], parts),) + e[4:]
                for e in logsql.bad_lines(parsed, limit)]
    return line_counts, spans, logsql.events(parsed), examples, parsed


def _snapshot_partition(rows):
    for index, line in rows:
        if not line.strip():
            continue
        try:
            yield ("r", snapshot_format.parse_line(line))
        except snapshot_format.SnapshotError as e:
            yield ("x", (index + 1, str(e)))


def _read_json_snapshot(sc, f, bad):
    """(message records RDD, header or None, the RDD to unpersist) of one snapshot file."""
    parsed = _text(sc, f).mapPartitions(_snapshot_partition)
    parsed.persist(StorageLevel.MEMORY_AND_DISK)
    small = parsed.filter(lambda t: t[0] == "x" or t[1]["record"] != "message").take(1000)
    errors = [t[1] for t in small if t[0] == "x"]
    meta = [t[1] for t in small if t[0] == "r"]
    count = parsed.filter(lambda t: t[0] == "r" and t[1]["record"] == "message").count()
    records = parsed.filter(lambda t: t[0] == "r" and t[1]["record"] == "message") \
        .map(lambda t: t[1])
    problems = snapshots.check_file(meta, errors, count)
    for p in problems:
        bad.append(inputs_mod.BadInput("corrupt-snapshot", f.path, p))
    headers = [r for r in meta if r["record"] == "snapshot"]
    header = headers[0] if headers else None
    return records, header, parsed


def _read_notqmail(sc, f, bad):
    """(message records RDD, header) of a notqmail queue text dump (a small file)."""
    text = sc.wholeTextFiles(f.path).collect()
    recs = []
    for _path, content in text:
        try:
            recs = list(snapshot_format.from_notqmail_text(content.splitlines(), f.host))
        except snapshot_format.SnapshotError as e:
            bad.append(inputs_mod.BadInput("corrupt-snapshot", f.path, str(e)))
            return None, None
    header = recs[0]
    return sc.parallelize([r for r in recs if r["record"] == "message"], 2), header


def _home_inputs(f, opts):
    """A qmail home as inputs: a snapshot taken now, its log-backend segments, and
    qmail-send's log as `qmailctl start` writes it (the rotated files, oldest first)."""
    directory = opts.home_snapshot_dir
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "%s-%d.snapshot" % (f.host, f.order))
    with open(path, "w", encoding="utf-8") as out:
        snapshot_format.write(home_snapshot.walk(f.path, host=f.host), out)
    found = [inputs_mod.InputFile(path, "snapshot", f.host, f.order)]
    logdir = os.path.join(f.path, "queue", "log")
    if os.path.isdir(logdir):
        for name in sorted(os.listdir(logdir)):
            if name.endswith(".seg"):
                found.append(inputs_mod.InputFile(os.path.join(logdir, name), "segment",
                                                  f.host, f.order))
    for path in log_set(os.path.join(f.path, "log"), QMQPD_LOG):  # QMQP clients (spark/fleet.py)
        found.append(inputs_mod.InputFile(path, "qmqpd", f.host, f.order))
    logs = log_set(os.path.join(f.path, "log"), SEND_LOG)
    for i, path in enumerate(logs):      # after the home's other inputs, before the next argument's
        found.append(inputs_mod.InputFile(path, "log", f.host, f.order + (i + 1) / (len(logs) + 1)))
    return found


def _start_ids(events):
    """One partition's `starting delivery` ids, per host in line order:
    (host, first (seq, id), last (seq, id), seqs where the id went down)."""
    by_host = {}
    for e in events:
        if e[3] == "start":
            by_host.setdefault(e[0], []).append((e[1], e[5]))
    for host, starts in by_host.items():
        starts.sort()
        yield host, starts[0], starts[-1], messages.id_drops(starts)


def _restarts(events):
    """{host: seqs of the first delivery of each later start of qmail-send}.

    qmail-send numbers its deliveries from 1 at every start, so a delivery id that
    is not above the one before it begins a new run."""
    found = {}
    parts = events.mapPartitions(_start_ids).collect()
    for host in {p[0] for p in parts}:
        seqs, last = [], None
        for _, first, final, drops in sorted((p for p in parts if p[0] == host), key=lambda p: p[1]):
            if last is not None and first[1] <= last[1]:
                seqs.append(first[0])
            seqs.extend(drops)
            last = final
        found[host] = sorted(seqs)
    return found


def _check_in_sql(spark, frame, opts, contexts, snap_records, persisted, restored):
    """(msgsql's tables of the messages of the common shape, event tuples of the others
    and of `state restored` lines, the others' paired deliveries keyed (host, n)): the
    common messages are checked in the JVM, the rest by messages.process_group. The
    events and deliveries are None when nothing is left for Python: no other message, no
    snapshot of a host with a log, no `state restored` line (restored: the log has one).
    Python's per-message stages are then not run at all: on a fleet of 20 hosts whose
    messages were all of the common shape they were 36 tasks of nothing, 7 s."""
    log_hosts = {h for h, c in contexts.items() if c.log_end is not None}
    covered = {h: [t for t in c.snapshots if c.log_covers(t)] for h, c in contexts.items()}
    keys = None
    for records, _taken, _lifetime in snap_records:
        found = records.filter(lambda r, hs=log_hosts: r["host"] in hs) \
            .map(lambda r: (r["host"], r["n"]))
        keys = found if keys is None else keys.union(found)
    if keys is not None:
        keys = spark.createDataFrame(keys, "host string, n long")
    classified = msgsql.classify(frame, opts.queuelifetime, opts.lifetime_slack, covered, keys)
    persisted.append(classified)
    tables, cached = msgsql.tables(classified, SCHEMAS)
    persisted.extend(cached)
    if keys is None and not restored and \
            not classified.filter(~F.col("simple")).limit(1).count():
        return tables, None, None
    events = msgsql.complex_events(classified).union(logsql.events(frame, ("restored",)))
    return tables, events, msgsql.complex_deliveries(classified)


# --- the job ------------------------------------------------------------------

def audit(spark, specs, out_dir, opts=None):
    opts = opts or Options()
    if opts.home_snapshot_dir is None:
        opts.home_snapshot_dir = os.path.join(out_dir, "snapshots")
    sc = spark.sparkContext
    inc = incremental.Run(out_dir, opts.full) if opts.incremental else None
    files, bad = inputs_mod.resolve(sc, specs, opts.host_map)
    files = [g for f in files for g in (_home_inputs(f, opts) if f.kind == "home" else [f])]
    path_bad = len(bad)         # what follows is bad content: an incremental run keeps it
    new_snapshots = 0

    # snapshots -------------------------------------------------------------
    snap_records = []           # (rdd of message records, taken, lifetime)
    snapshot_hosts = {}
    queue_snapshots = []        # (host, taken, records) for the fleet queue
    persisted = []
    for f in files:
        if f.kind in ("snapshot", "notqmail") and inc is not None:
            if not inc.new_snapshot(sc, f):
                continue            # read by an earlier run
            new_snapshots += 1
        if f.kind == "snapshot":
            records, header, parsed = _read_json_snapshot(sc, f, bad)
            persisted.append(parsed)
        elif f.kind == "notqmail":
            records, header = _read_notqmail(sc, f, bad)
        else:
            continue
        if records is None:
            continue
        if header is None:
            continue            # reported as corrupt; without its time nothing can be judged
        taken, lifetime = header["taken"], header["queuelifetime"]
        snap_records.append((records, taken, lifetime))
        snapshot_hosts.setdefault(header["host"], []).append(taken)
        queue_snapshots.append((header["host"], taken, records))
        if inc is not None:
            inc.note_snapshot(header["host"], taken, f)
    if inc is not None:
        queue_snapshots += _older_latest(sc, inc, queue_snapshots, persisted)

    # logs ------------------------------------------------------------------
    log_files = sorted((f for f in files if f.kind == "log"), key=lambda f: (f.host, f.order))
    rows = None
    if inc is not None:
        rows = inc.log_rows(sc, log_files)
        if rows is None:
            if not (new_snapshots or bad or opts.where or any(f.kind == "segment" for f in files)):
                previous = inc.previous()
                if previous is not None:        # nothing new: nothing changes
                    return AuditResult(previous, previous["findings"]["by_kind"],
                                       previous["findings"]["violations"],
                                       previous["bad_input"], out_dir)
            rows = sc.emptyRDD()
        rows.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(rows)
        inc.count_lines(rows)
    if opts.parser == "sql":
        line_counts, spans, events, examples, frame = _logs_sql(spark, log_files, persisted,
                                                                rows)
    else:
        line_counts, spans, events, examples = _logs_python(sc, log_files, persisted, rows)
        frame = None
    parts = _partitions(sc, sum(line_counts.values()))
    kinds_read = set(line_counts)       # of this run's lines (an incremental run merges below)
    log_names = [f.path for f in log_files]
    bad_counts = {k[4:]: v for k, v in line_counts.items() if k.startswith("bad:")}
    if bad_counts:
        examples = examples(200)
        for kind, count in sorted(bad_counts.items()):
            shown = [e for e in examples if e[0] == kind][:EXAMPLES_PER_KIND]
            for e in shown:
                bad.append(inputs_mod.BadInput(kind, inc.path_of(e[1], e[2]) if inc else
                                               log_names[e[2]],
                                               "%s: %s" % (logparse.position(e[3]), e[4])))
            if count > len(shown):
                bad.append(inputs_mod.BadInput(kind, None, "%d more" % (count - len(shown))))
    if inc is not None:
        bad += [inputs_mod.BadInput(*b) for b in inc.keep_bad(bad[path_bad:])]
        line_counts, spans = inc.merge_counts(line_counts, spans)
        snapshot_hosts = inc.snapshot_times()

    # segments ----------------------------------------------------------------
    seg_rows = None
    seg_files = [f for f in files if f.kind == "segment"]
    read = segments.reader() if seg_files else None
    for f in seg_files:
        if read is None:
            bad.append(inputs_mod.BadInput(
                "unreadable-segment", f.path,
                "this installation has no log-backend segment reader (%s)"
                % segments.READER_MODULE))
            continue
        rows = sc.binaryFiles(f.path).flatMap(
            lambda pd, h=f.host, rd=read: segments.records(rd, h, pd[0], pd[1]))
        seg_rows = rows if seg_rows is None else seg_rows.union(rows)

    # per-message tables ------------------------------------------------------
    if frame is not None:
        restarts = logsql.restarts(frame)
    else:
        restarts = _restarts(events) if events is not None else {}
    if inc is not None:
        starts = (events if frame is None else logsql.events(frame)) \
            .filter(lambda e: e[3] == "start").map(lambda e: (e[0], (e[1], e[5])))
        restarts = inc.restarts(restarts, dict(starts.reduceByKey(min).collect()),
                                dict(starts.reduceByKey(max).collect()))
    contexts = {}
    for host in set(spans) | set(snapshot_hosts):
        span = spans.get(host)
        contexts[host] = messages.HostContext(
            log_start=span[0] if span else None, log_end=span[2] if span else None,
            log_end_exiting=bool(span and span[3] == "exiting"),
            snapshots=snapshot_hosts.get(host, ()) if span else (),
            queuelifetime=opts.queuelifetime, lifetime_slack=opts.lifetime_slack,
            restarts=restarts.get(host, ()))
    ctx_b = sc.broadcast(contexts)

    sql_frames = {}
    row_rdds = []
    open_rdds = []              # incremental: rows recomputed each run, not accumulated
    if events is not None:
        if inc is not None:
            paired, pending = inc.pairs(sc, _starts_and_results(events, frame), parts)
        elif frame is not None:     # the common messages checked in the JVM, the rest here
            sql_frames, events, paired = _check_in_sql(spark, frame, opts, contexts,
                                                       snap_records, persisted,
                                                       "state restored" in kinds_read)
        else:
            deliveries = events.filter(lambda e: e[3] in ("start", "result")) \
                .map(lambda e: ((e[0], e[5]), e)).groupByKey(parts) \
                .map(lambda kv: messages.pair_deliveries(list(kv[1])))
            paired = deliveries.flatMap(lambda pu: pu[0])
    if events is not None:      # None here: the JVM checked every message, none is left
        msg_events = events.filter(lambda e: e[3] in logparse.MESSAGE_KINDS) \
            .map(lambda e: ((e[0], e[4]), ("ev", e, e[1], e[2])))
        keyed = msg_events.union(paired)
        log_hosts = set(spans)
        for records, taken, _lifetime in snap_records:
            keyed = keyed.union(records.filter(lambda r, hs=log_hosts: r["host"] in hs)
                                .map(lambda r, t=taken: snapshots.observation(r, t)))
        if inc is None:
            grouped = keyed.groupByKey(parts).flatMap(
                lambda kv: messages.process_group(kv[0][0], kv[0][1], list(kv[1]),
                                                  ctx_b.value[kv[0][0]]))
            row_rdds.append(grouped)
        else:
            carried = inc.carried_items(spark)
            if carried is not None:
                keyed = keyed.union(carried)
            groups = keyed.groupByKey(parts).map(lambda kv: incremental.group_rows(
                kv, ctx_b.value[kv[0][0]], messages.process_group))
            groups.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(groups)
            row_rdds.append(groups.filter(lambda g: not g[0]).flatMap(lambda g: g[1]))
            open_rdds.append(groups.filter(lambda g: g[0]).flatMap(lambda g: g[1]))
            carried = groups.flatMap(lambda g: g[2])
        if "state restored" in kinds_read:     # else a pass over all events finds none
            row_rdds.append(events.filter(lambda e: e[3] == "restored")
                            .map(messages.restored_finding))
        if "set aside" in kinds_read:
            row_rdds.append(events.filter(lambda e: e[3] == "setaside")
                            .map(messages.set_aside_finding))
    for records, taken, lifetime in snap_records:
        row_rdds.append(records.flatMap(
            lambda r, t=taken, q=lifetime, s=opts.lifetime_slack:
            snapshots.check_record(r, t, q, s)))
    if seg_rows is not None:
        seg_rows.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(seg_rows)
        for _tag, (kind, path, detail) in seg_rows.filter(lambda t: t[0] == "bad").collect():
            bad.append(inputs_mod.BadInput(kind, path, detail))
        seg_out = row_rdds if inc is None else open_rdds    # segments are read whole each run
        seg_out.append(seg_rows.filter(lambda t: t[0] == "f"))
        seg_out.append(seg_rows.filter(lambda t: t[0] == "seg").map(lambda t: t[1])
                       .groupByKey().flatMap(lambda kv: segments.process_segment_group(
                           kv[0][0], kv[0][1], list(kv[1]))))
    table, frames = _tables(spark, _union(sc, row_rdds, parts))
    for tag, df in sql_frames.items():
        frames[tag] = frames[tag].unionByName(df)
    os.makedirs(out_dir, exist_ok=True)
    if inc is not None:
        open_table, open_frames = _tables(spark, _union(sc, open_rdds, parts))
        inc.write_run(spark, frames, open_frames, carried, pending.collect(), SCHEMAS)
        open_table.unpersist()
        table.unpersist()
        frames = inc.view(spark, SCHEMAS)
        table = frames["occ"]   # unpersisted below: the view is not persisted
    fleet = None
    if opts.fleet_map is not None:
        fleet = _fleet(spark, frames, opts, set(spans), set(snapshot_hosts),
                       [f for f in files if f.kind == "qmqpd"])
        frames["f"] = frames["f"].unionByName(
            spark.createDataFrame(fleet.findings, SCHEMAS["f"]))
    if opts.write_parquet:
        names = {"occ": "messages", "tr": "transitions", "m": "qmailanalog_m",
                 "d": "deliveries", "f": "findings"}
        for tag, name in names.items():
            frames[tag].write.mode("overwrite").parquet(_uri(out_dir, name + ".parquet"))
        frames["f"].write.mode("overwrite").json(_uri(out_dir, "findings.json"))

    summary, summary_tables = summaries.compute(frames, line_counts)
    results = line_counts.get("delivery", 0) + line_counts.get("report mangled", 0)
    summary["log"]["unmatched_results"] = results - summary["deliveries"]["matched_results"]
    if inc is not None:
        summary["incremental"] = inc.summary()
    summary["inputs"] = {
        "files": [{"path": f.path, "kind": f.kind, "host": f.host} for f in files],
        "hosts": sorted(set(spans) | set(snapshot_hosts)),
    }
    bad_list = _bad_summary(bad)
    summary["bad_input"] = bad_list
    summary["warnings"] = host_warnings(set(spans), set(snapshot_hosts))
    if fleet is not None:
        summary["fleet"] = fleet.summary()
        summary["warnings"] += fleet_warnings(fleet, set(spans) | set(snapshot_hosts))
        if opts.write_parquet:
            spark.createDataFrame(fleet.journeys, JOURNEY_SCHEMA).write.mode("overwrite") \
                .parquet(_uri(out_dir, "journeys.parquet"))
    queue = fleetqueue.FleetQueue(sc, queue_snapshots)
    summary["fleet_queue"] = queue.summary()
    if opts.write_parquet:
        queue.write(spark, _uri(out_dir, "fleet_queue.parquet"))
    where = None if opts.where is None else where_mod.answer(*opts.where, queue, fleet)
    findings_by_kind = summary["findings"]["by_kind"]
    violations = summary["findings"]["violations"]
    if opts.write_parquet:
        for name, df in summary_tables.items():
            df.write.mode("overwrite").parquet(_uri(out_dir, name + ".parquet"))
    with open(os.path.join(out_dir, "summaries.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
    with open(os.path.join(out_dir, "zoverall.txt"), "w") as f:
        f.write(summaries.zoverall_text(summary["qmailanalog"]))
    plots = summaries.plot_data(frames, summary)
    with open(os.path.join(out_dir, "report.html"), "w", encoding="utf-8") as f:
        f.write(report.render(summary, plots))
    checked_in_jvm = sql_frames["occ"].count() if sql_frames else 0
    for rdd in persisted + list(summary_tables.values()):
        rdd.unpersist()
    table.unpersist()
    result = AuditResult(summary, findings_by_kind, violations, bad_list, out_dir)
    result.where = where
    result.checked_in_jvm = checked_in_jvm
    return result


LINES_PER_PARTITION = 500_000


def _partitions(sc, lines):
    """Partitions of the per-message stages and tables for this many log lines: as many
    as the cores, more for a large log. Not one per input file or per union member: a
    fleet's 20 small logs made every later job (the writes, the summaries) 60 tasks of
    mostly nothing (docs/architecture.md "Reading log lines: in Python or in the JVM")."""
    return max(2, sc.defaultParallelism, -(-lines // LINES_PER_PARTITION))


def _union(sc, rdds, parts):
    """The rows of rdds in at most parts partitions (no shuffle)."""
    if not rdds:
        return sc.parallelize([])
    rows = sc.union(rdds)
    return rows.coalesce(parts) if rows.getNumPartitions() > parts else rows


def _tables(spark, rows):
    """(persisted DataFrame, {tag: DataFrame}) of tagged rows: one Python -> JVM conversion
    for all tables, a row holding its table's struct."""
    tags = list(SCHEMAS)
    combined = T.StructType([T.StructField("tag", T.StringType(), False)]
                            + [T.StructField(tag, SCHEMAS[tag], True) for tag in tags])
    spread = rows.map(lambda t: (t[0],) + tuple(t[1] if t[0] == g else None for g in tags))
    table = spark.createDataFrame(spread, combined).persist(StorageLevel.MEMORY_AND_DISK)
    return table, {tag: table.filter(table["tag"] == tag).select(tag + ".*") for tag in tags}


def _starts_and_results(events, frame):
    """The `starting delivery` and result events (the SQL parser's events leave results
    to its own pairing)."""
    if frame is not None:
        events = frame.filter(F.col("ekind").isin("start", "result")).rdd \
            .map(logsql.event_tuple)
    return events.filter(lambda e: e[3] in ("start", "result"))


def _older_latest(sc, inc, queue_snapshots, persisted):
    """(host, taken, records) of each host's newest snapshot read by an earlier run, for
    the hosts without a snapshot in this one: the fleet queue shows it."""
    out = []
    for host, taken, path, kind, gz in inc.older_latest_snapshots({q[0] for q in queue_snapshots}):
        f = inputs_mod.InputFile(path, kind, host, 0, gz)
        try:
            if kind == "snapshot":
                records, _header, parsed = _read_json_snapshot(sc, f, [])
                persisted.append(parsed)
            else:
                records, _header = _read_notqmail(sc, f, [])
        except Exception:           # gone since: the fleet queue goes without it
            continue
        if records is not None:
            out.append((host, taken, records))
    return out


JOURNEY_SCHEMA = T.StructType([
    T.StructField("origin_host", _S), T.StructField("origin_n", _L),
    T.StructField("origin_birth", _D), T.StructField("route", _S),
    T.StructField("hop_count", _L),
    T.StructField("hops", T.ArrayType(T.StructType([
        T.StructField("host", _S), T.StructField("n", _L), T.StructField("queued", _D),
        T.StructField("left", _D), T.StructField("latency", _D)]))),
    T.StructField("ended", _S), T.StructField("ended_where", T.ArrayType(_S)),
    T.StructField("end_to_end", _D), T.StructField("loop", _B), T.StructField("lost", _B),
])


def _fleet(spark, frames, opts, log_hosts, snapshot_hosts, qmqpd_files=()):
    """The fleet linked on the driver from the messages, their deliveries and
    qmail-qmqpd's `qmqp from` lines."""
    from qmailpy.logline import parse_qmqp_from
    qmqp_rows = []
    for f in qmqpd_files:
        qmqp_rows += spark.sparkContext.textFile(f.path).map(parse_qmqp_from) \
            .filter(lambda t: t is not None and t[0] is not None) \
            .map(lambda t, h=f.host: (h,) + t).collect()
    occ_rows = _ordered(_dicts(frames["occ"].select(
        "host", "n", "birth", "bytes", "sender", "qp", "end_time", "ended", "bounced", "triple",
        "orphan")), "host", "n", "birth")
    d = frames["d"]
    delivery_rows = _ordered(_dicts(d.filter((d["result"] == "k") | (d["channel"] == "remote"))
                                    .select("host", "n", "occ_birth", "result", "channel",
                                            "recipient", "dstart", "ddone", "reason")),
                             "host", "n", "occ_birth")    # a message's own in line order
    return fleet_mod.Fleet(opts.fleet_map, occ_rows, delivery_rows, snapshot_hosts, log_hosts,
                           opts.skew, qmqp_rows)


def _dicts(df):
    """The rows of df as dicts: Fleet reads each field by name, which a Row looks up in
    its list of names each time (200,000 rows' 11 fields: 15 s as Rows, 5.5 s made dicts
    and read, under a load of 18). Collected as Arrow batches, not pickled Rows: 300,000
    rows of five columns in 1.5 s instead of 4.0 s."""
    return df.toArrow().to_pylist()


def _ordered(rows, *fields):
    """rows sorted by fields (None first; stable): Fleet breaks ties in its input's order,
    which must not depend on how Spark partitioned the tables."""
    return sorted(rows, key=lambda r: tuple((r[f] is not None, r[f]) for f in fields))


def fleet_warnings(fleet, input_hosts):
    out = ["host %s of the fleet map has no input: hand-offs to it are not judged" % h
           for h in sorted(fleet.fleet_hosts - input_hosts - fleet.null_clients())]
    out += ["host %s has inputs but is not in the fleet map: nothing is handed to it by "
            "address" % h for h in sorted(input_hosts - fleet.fleet_hosts)]
    return out


def host_warnings(log_hosts, snapshot_hosts):
    """Hosts that only one kind of input speaks for, when the inputs hold both kinds.

    Log and snapshot are only compared within one host, so a host-name mismatch
    (a snapshot named after the machine, a log after its directory) silently
    turns the cross-checks off.
    """
    if not log_hosts or not snapshot_hosts:
        return []
    out = ["snapshot of host %s has no log among the inputs: its messages are not compared "
           "with a log (name the log's host with --host %s=PATH)" % (h, h)
           for h in sorted(snapshot_hosts - log_hosts)]
    out += ["log of host %s has no snapshot among the inputs: its messages are not compared "
            "with a snapshot, and its queue is not in the fleet queue" % h
            for h in sorted(log_hosts - snapshot_hosts)]
    return out


def _bad_summary(bad):
    """Bad inputs grouped by kind: count and up to EXAMPLES_PER_KIND examples."""
    grouped = {}
    for b in bad:
        entry = grouped.setdefault(b.kind, {"kind": b.kind, "count": 0, "examples": []})
        if b.path is None and b.detail.endswith("more"):
            entry["count"] += int(b.detail.split()[0])
            continue
        entry["count"] += 1
        if len(entry["examples"]) < EXAMPLES_PER_KIND:
            entry["examples"].append(b.as_dict())
    return sorted(grouped.values(), key=lambda e: e["kind"])


def _uri(out_dir, name):
    path = os.path.join(out_dir, name)
    return path if "://" in path else "file://" + os.path.abspath(path)
