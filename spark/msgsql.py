"""messages.process_group in the JVM for the messages of the common shape (--parser=sql).

Most messages of a qmail-send log read `new msg`, `info msg`, then starts, delivery
results, bounces, `end msg`, each a legal move. For a (host, number) whose events all
have that shape, the rows process_group would give (messages, transitions, m and d
lines, failure-not-bounced findings) are computed here with window functions and
aggregates over (host, n) ordered by seq; every other (host, number) goes to
process_group in Python, whole. The moves are not a second copy of the state table:
moves() asks qmailpy.states through messages' own path search, once, on the driver.

A (host, n) is checked here when all of these hold, and otherwise in Python:

* its first event is `new msg`; `info msg` follows every `new msg` at once, and once;
  after `end msg` only a `new msg` comes; its last event is `end msg` (so nothing
  is left open: no never-ended, no vanished-while-queued judgement);
* every event is new, info, start, a paired result, bounce, triple or end, and its
  move from the state the previous one left is in moves() (legal);
* no (channel, recipient) succeeds twice in one occurrence (duplicate-delivery
  depends on qmail-send's restarts);
* no result is past the queue lifetime's marks that _check_lifetime watches (a
  failure started after birth + queuelifetime + slack, a deferral after the
  channel's last scheduled pass + slack);
* no snapshot of its host records the number, and none taken while the log covers
  it falls between an occurrence's birth and end;
* its senders and recipients are ASCII (Python's and Java's lower() agree there).
"""
from pyspark import StorageLevel
from pyspark.sql import Window
from pyspark.sql import functions as F

from qmailpy import states
from qmailpy_audit import logparse, logsql, messages

SHAPE_KINDS = ("new", "info", "start", "result", "bounce", "triple", "end")
_MIDDLE = ("start", "result", "bounce", "triple")
ITEM_COLUMNS = ("host", "n", "seq", "time", "kind", "d", "a_long", "a_str", "b_long", "b_str",
                "c", "channel", "recipient", "dstart", "start_seq")


def _after(kind):
    return states.LOG_EVENT_TRANSITIONS[messages.EVENT_NAMES[kind]][1]


def moves():
    """{(previous kind or None, kind): (from_state, via, to_state)} of the common shape's
    legal moves, as process_group's check() and open_occurrence() find them."""
    out = {}
    before, after = states.LOG_EVENT_TRANSITIONS[messages.EVENT_NAMES["new"]]
    if messages.event_move_legal(before, after):
        via = ">".join(s for s in messages._opening_path(before) or () if s != after)
        out[(None, "new")] = out[("end", "new")] = (messages.ABSENT, via, after)
    pairs = [("new", "info")] + [(p, k) for p in ("info",) + _MIDDLE for k in _MIDDLE + ("end",)]
    for prev, kind in pairs:
        start = _after(prev)
        before, after = states.LOG_EVENT_TRANSITIONS[messages.EVENT_NAMES[kind]]
        path = messages._implicit_path(start, before)
        if path is None or not messages.event_move_legal(before, after):
            continue
        out[(prev, kind)] = (start, ">".join(s for s in path if s != after), after)
    return out


def items(parsed):
    """The events of messages and the paired delivery results, one row each (ITEM_COLUMNS)."""
    none = F.lit(None)
    events = parsed.filter(F.col("ekind").isin(*logparse.MESSAGE_KINDS)).select(
        "host", "n", "seq", "time", F.col("ekind").alias("kind"), "d", "a_long", "a_str",
        "b_long", "b_str", "c", none.cast("string").alias("channel"),
        none.cast("string").alias("recipient"), none.cast("double").alias("dstart"),
        none.cast("long").alias("start_seq"))
    p = logsql.paired_frame(parsed)
    results = p.select(
        "host", F.col("p_n").alias("n"), "seq", "time", F.lit("result").alias("kind"), "d",
        none.cast("long").alias("a_long"), "a_str", none.cast("long").alias("b_long"), "b_str",
        none.cast("string").alias("c"), F.col("p_a_str").alias("channel"),
        F.col("p_b_str").alias("recipient"), F.col("p_time").alias("dstart"),
        F.col("p_seq").alias("start_seq"))
    return events.unionByName(results)


def python_item(r):
    """A row of items() as process_group's item, keyed (host, n)."""
    key = (r["host"], r["n"])
    if r["kind"] == "result":
        return key, ("del", (r["dstart"], r["d"], r["channel"], r["recipient"], r["a_str"],
                             r["b_str"], r["start_seq"]), r["seq"], r["time"])
    kind = r["kind"]
    a = r["a_long"] if kind in logsql.A_IS_NUMBER else r["a_str"]
    b = r["b_long"] if kind in logsql.B_IS_NUMBER else r["b_str"]
    return key, ("ev", (r["host"], r["seq"], r["time"], kind, r["n"], r["d"], a, b, r["c"]),
                 r["seq"], r["time"])


def _literal_map(mapping):
    return F.create_map(*[F.lit(x) for kv in mapping.items() for x in kv])


def _ascii(column):
    return column.rlike(r"^[\x00-\x7f]*$")


def classify(parsed, queuelifetime, slack, snapshot_times, snapshot_keys=None):
    """items() with `simple` (its (host, n) is checked here) and the running columns the
    tables need, persisted.

    snapshot_times: {host: snapshot times the host's log covers}; snapshot_keys: a
    frame of (host, n) that a snapshot records (for hosts with a log), or None."""
    kind, time = F.col("kind"), F.col("time")
    w = Window.partitionBy("host", "n").orderBy("seq")
    whole = Window.partitionBy("host", "n")
    frame = items(parsed)
    if snapshot_keys is not None:
        frame = frame.join(snapshot_keys.distinct().withColumn("snapped", F.lit(True)),
                           ["host", "n"], "left")
    else:
        frame = frame.withColumn("snapped", F.lit(None).cast("boolean"))

    def running(value):
        return F.last(value, ignorenulls=True).over(w)
    frame = frame.select(
        "*", F.lag("kind").over(w).alias("prev"), F.lead("kind").over(w).alias("next"),
        F.sum(F.when(kind == "new", 1).otherwise(0)).over(w).alias("occ_no"),
        running(F.when(kind == "new", time)).alias("birth"),
        running(F.when(kind == "info", time)).alias("info_time"),
        running(F.when(kind == "info", F.col("a_long"))).alias("bytes"),
        running(F.when(kind == "info", F.col("b_str"))).alias("sender"),
        running(F.when(kind == "info", F.col("c"))).alias("qp_uid"))
    table = moves()
    keys = {"%s>%s" % (prev or "", k): v for (prev, k), v in table.items()}
    move_key = F.concat(F.coalesce(F.col("prev"), F.lit("")), F.lit(">"), kind)
    for i, name in enumerate(("from_state", "via", "to_state")):
        frame = frame.withColumn(name, F.try_element_at(
            _literal_map({k: v[i] for k, v in keys.items()}), move_key))
    birth, dstart, letter = F.col("birth"), F.col("dstart"), F.col("a_str")
    late = F.lit(False)
    for channel in messages.RETRY_SKIP:
        offset = messages.last_attempt_offset(channel, queuelifetime)
        late = late | ((F.col("channel") == channel) & (
            ((letter == "d") & (dstart > birth + float(queuelifetime) + slack))
            | ((letter == "z") & (dstart > birth + float(offset) + slack))))
    alive = F.lit(False)
    for host, times in snapshot_times.items():
        for taken in times:
            alive = alive | ((F.col("host") == host) & (birth < taken) & (time > taken))
    ok = F.col("from_state").isNotNull() & (F.col("next").isNotNull() | (kind == "end")) \
        & ((kind != "info") | _ascii(F.col("sender"))) \
        & ((kind != "result") | (_ascii(F.col("recipient")) & ~late)) \
        & ((kind != "end") | ~alive)
    success = F.when((kind == "result") & (letter == "k"),
                     F.struct("occ_no", "channel", "recipient"))
    frame = frame.withColumn("row_ok", F.coalesce(ok, F.lit(False)))
    frame = frame.withColumn(
        "simple",
        F.min(F.col("row_ok").cast("int")).over(whole).cast("boolean")
        & (F.count(success).over(whole) == F.size(F.collect_set(success).over(whole)))
        & F.max(F.coalesce(F.col("snapped"), F.lit(False)).cast("int")).over(whole)
        .cast("boolean").__invert__())
    return frame.persist(StorageLevel.MEMORY_AND_DISK)


def complex_events(classified):
    """The event tuples (logparse's) of the (host, n) left to process_group, an RDD."""
    rows = classified.filter(~F.col("simple") & (F.col("kind") != "result"))
    return rows.select(*ITEM_COLUMNS).rdd.map(lambda r: python_item(r)[1][1])


def complex_deliveries(classified):
    """The paired deliveries of the (host, n) left to process_group, as
    ((host, n), ("del", delivery, seq, time)) in an RDD."""
    rows = classified.filter(~F.col("simple") & (F.col("kind") == "result"))
    return rows.select(*ITEM_COLUMNS).rdd.map(python_item)


def _conform(df, schema):
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def _domain(recipient):
    return F.when(F.instr(recipient, "@") > 0, F.substring_index(recipient, "@", -1)) \
        .otherwise(F.lit(""))


def tables(classified, schemas):
    """{tag: DataFrame} of process_group's rows for the simple (host, n), in the schemas
    of job.SCHEMAS; occ and d persisted (the caller unpersists them)."""
    kind, letter = F.col("kind"), F.col("a_str")
    rows = classified.filter(F.col("simple"))
    names = _literal_map(messages.EVENT_NAMES)
    tr = rows.select("host", "n", "birth", "seq", "time",
                     F.element_at(names, kind).alias("event"), "from_state", "via", "to_state",
                     F.lit(True).alias("legal"))

    def count(cond):
        return F.count(F.when(cond, 1))
    occ = rows.groupBy("host", "n", "occ_no").agg(
        F.min("birth").alias("birth"),
        F.max(F.when(kind == "info", F.col("time"))).alias("info_time"),
        F.max(F.when(kind == "info", F.col("a_long"))).alias("bytes"),
        F.max(F.when(kind == "info", F.col("b_str"))).alias("sender"),
        F.max(F.when(kind == "info", F.col("c"))).alias("qp_uid"),
        F.max(F.when(kind == "end", F.col("time"))).alias("end_time"),
        count(kind == "start").alias("attempts"),
        count((kind == "result") & (letter == "k")).alias("successes"),
        count((kind == "result") & (letter == "d")).alias("failures"),
        count((kind == "result") & (letter == "z")).alias("nz"),
        count((kind == "result") & ~letter.isin("k", "d")).alias("deferrals"),
        count(kind == "bounce").alias("bounced"), count(kind == "triple").alias("triple"))
    qp_uid = F.split(F.col("qp_uid"), " ")
    occ = occ.select("*", qp_uid.getItem(0).cast("long").alias("qp"),
                     qp_uid.getItem(1).cast("long").alias("uid"),
                     F.lit(True).alias("ended"), F.lit(False).alias("orphan"),
                     F.lit(_after("end")).alias("last_state")) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    m = occ.select("host", F.col("info_time").alias("birth"), F.col("end_time").alias("done"),
                   "bytes", F.col("successes").alias("nk"), F.col("failures").alias("nd"), "nz",
                   F.lower("sender").alias("sender"), "qp", "uid")
    f = occ.filter((F.col("failures") > 0) & (F.col("bounced") == 0) & (F.col("triple") == 0)) \
        .select("host", "n", "birth", F.lit("failure-not-bounced").alias("kind"),
                F.lit(messages.FINDING_KINDS["failure-not-bounced"]).alias("severity"),
                F.col("end_time").alias("time"),
                F.format_string("%d failed recipient(s), ended without bounce msg",
                                F.col("failures")).alias("detail"))
    recipient = F.lower(F.col("recipient"))
    d = rows.filter(kind == "result").select(
        "host", "n", F.col("birth").alias("occ_birth"), F.col("a_str").alias("result"),
        F.col("info_time").alias("birth"), "dstart", F.col("time").alias("ddone"), "bytes",
        F.lower("sender").alias("sender"), "channel", recipient.alias("recipient"),
        _domain(recipient).alias("domain"), F.col("b_str").alias("reason")) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    out = {"occ": occ, "tr": tr, "m": m, "d": d, "f": f}
    return {tag: _conform(df, schemas[tag]) for tag, df in out.items()}, [occ, d]
