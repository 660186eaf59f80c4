"""Summaries of the per-message tables, as qmail log analysers give them.

The qmailanalog figures follow zoverall(1) over matchup(1)'s m and d lines
exactly (MLINE/DLINE rows of qmailpy_audit.messages):

  completed messages     number of m lines
  recipients             sum of nk + nd           (successes + failures)
  attempts (completed)   sum of nk + nd + nz
  bytes                  sum of bytes;  bytes weighted by success: sum of bytes * nk
  qtime                  done - birth per m line  (birth = the info msg line's time)
  delivery attempts      number of d lines; success k, failure d, deferral the rest
  ddelay                 ddone - birth per successful d line
  xdelay                 ddone - dstart per d line
  time span              last - first over m births/dones and d births/ddones
  queue concurrency      total xdelay / time span

Everything else (per domain, sender, hour, host; delay percentiles) is computed
from the same rows.
"""
from pyspark import StorageLevel
from pyspark.sql import functions as F

TOP = 500          # rows of each per-key table kept in summaries.json (Parquet has all)


def _awk(value):
    """A number as awk's print shows it (integers bare, else %.6g)."""
    if value is None:
        return ""
    if float(value).is_integer() and abs(value) < 1e16:
        return "%d" % value
    return "%.6g" % value


def _row(r):
    return None if r is None else r.asDict()


def _delivery_groups(d):
    """One pass over the d lines: per (channel, result) counts, delays and time bounds."""
    return d.groupBy("channel", "result").agg(
        F.count(F.lit(1)).alias("count"),
        F.sum(F.col("ddone") - F.col("birth")).alias("ddelay"),
        F.sum(F.col("ddone") - F.col("dstart")).alias("xdelay"),
        F.min("birth").alias("first"), F.max("ddone").alias("last"))


def _collect_together(parts):
    """{name: [Row]} of several small DataFrames {name: DataFrame} in one Spark job: each
    runs as it would alone (same plan, same row order), a row holding its part's struct.
    Many small jobs cost the audit more than their work (scheduling, planning, stages)."""
    merged = None
    for name, df in parts.items():
        tagged = df.select(F.lit(name).alias("part"), F.struct(*df.columns).alias(name))
        merged = tagged if merged is None else merged.unionByName(tagged,
                                                                  allowMissingColumns=True)
    out = {name: [] for name in parts}
    for r in merged.collect():
        out[r["part"]].append(r[r["part"]])
    return out


def _message_totals(m):
    return m.agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.col("nk") + F.col("nd")).alias("recipients"),
        F.sum(F.col("nk") + F.col("nd") + F.col("nz")).alias("tries"),
        F.sum("bytes").alias("bytes"),
        F.sum(F.col("bytes") * F.col("nk")).alias("bytes_weighted_by_success"),
        F.sum(F.col("done") - F.col("birth")).alias("qtime"),
        F.min("birth").alias("first"), F.max("done").alias("last"),
        F.max(F.col("done") - F.col("birth")).alias("qtime_max"),
        F.expr("percentile(done - birth, array(0.5, 0.9, 0.99))").alias("qtime_p"))


def qmailanalog(mr, groups):
    """zoverall's figures from the m-line totals and the d-line groups."""
    deliveries = sum(g["count"] for g in groups)
    success = sum(g["count"] for g in groups if g["result"] == "k")
    failure = sum(g["count"] for g in groups if g["result"] == "d")
    ddelay = sum(g["ddelay"] for g in groups if g["result"] == "k")
    xdelay = sum(g["xdelay"] for g in groups)
    out = {"completed_messages": mr["messages"]}
    if mr["messages"]:
        out.update({
            "recipients": mr["recipients"], "attempts_for_completed": mr["tries"],
            "avg_attempts_per_completed": mr["tries"] / mr["messages"],
            "bytes": mr["bytes"], "bytes_weighted_by_success": mr["bytes_weighted_by_success"],
            "avg_qtime": mr["qtime"] / mr["messages"], "qtime_total": mr["qtime"]})
    out["delivery_attempts"] = deliveries
    if deliveries:
        out.update({"success": success, "failure": failure,
                    "deferral": deliveries - success - failure,
                    "ddelay_total": ddelay, "xdelay_total": xdelay,
                    "avg_xdelay": xdelay / deliveries})
        if success:
            out["avg_ddelay"] = ddelay / success
    firsts = [v for v in [mr["first"]] + [g["first"] for g in groups] if v is not None]
    lasts = [v for v in [mr["last"]] + [g["last"] for g in groups] if v is not None]
    if firsts and lasts:
        out["first"], out["last"] = min(firsts), max(lasts)
        span = out["last"] - out["first"]
        out["time_span"] = span
        if deliveries and span > 0:
            out["concurrency"] = xdelay / span
    return out


def zoverall_text(q):
    """The figures laid out like qmailanalog's zoverall report."""
    lines = ["Basic statistics (qmail-audit, zoverall definitions)", "",
             "Completed messages: %s" % _awk(q["completed_messages"])]
    if q["completed_messages"]:
        lines += ["Recipients for completed messages: %s" % _awk(q["recipients"]),
                  "Total delivery attempts for completed messages: %s"
                  % _awk(q["attempts_for_completed"]),
                  "Average delivery attempts per completed message: %s"
                  % _awk(q["avg_attempts_per_completed"]),
                  "Bytes in completed messages: %s" % _awk(q["bytes"]),
                  "Bytes weighted by success: %s" % _awk(q["bytes_weighted_by_success"]),
                  "Average message qtime (s): %s" % _awk(q["avg_qtime"])]
    lines += ["", "Total delivery attempts: %s" % _awk(q["delivery_attempts"])]
    if q["delivery_attempts"]:
        lines += ["  success: %s" % _awk(q["success"]), "  failure: %s" % _awk(q["failure"]),
                  "  deferral: %s" % _awk(q["deferral"]),
                  "Total ddelay (s): %.6f" % q["ddelay_total"]]
        if q["success"]:
            lines.append("Average ddelay per success (s): %.6f" % q["avg_ddelay"])
        lines += ["Total xdelay (s): %.6f" % q["xdelay_total"],
                  "Average xdelay per delivery attempt (s): %.6f" % q["avg_xdelay"]]
        span = q.get("time_span")
        if span and span > 0:
            if span > 86400:
                lines.append("Time span (days): %s" % _awk(span / 86400))
            else:
                lines.append("Time span (s): %s" % _awk(span))
            lines.append("Queue concurrency: %s" % _awk(q["concurrency"]))
    return "\n".join(lines) + "\n"


def _stats(count, avg, mx, p):
    if not count:
        return {"count": 0}
    return {"count": count, "avg": avg, "p50": p[0], "p90": p[1], "p99": p[2], "max": mx}


PERCENTILES = (50, 90, 99)
# ddelay of each success; percentile() is exact (linear between closest ranks)
_DDELAY_P = "percentile(CASE WHEN result = 'k' THEN ddone - birth END, array(%s))" \
    % ", ".join("%.2f" % (p / 100.0) for p in PERCENTILES)


def _ddelay_columns(df):
    """avg_ddelay and p50/p90/p99_ddelay (successes only) from an aggregated ddelay_p."""
    for i, p in enumerate(PERCENTILES):
        df = df.withColumn("p%d_ddelay" % p, F.col("ddelay_p").getItem(i))
    return df.drop("ddelay_p")


def tables(frames):
    """The per-key summary DataFrames: domain, sender, hour, host."""
    d, m, occ = frames["d"], frames["m"], frames["occ"]
    k = F.when(F.col("result") == "k", 1).otherwise(0)
    fl = F.when(F.col("result") == "d", 1).otherwise(0)
    z = F.when(F.col("result") == "z", 1).otherwise(0)
    xdelay = F.col("ddone") - F.col("dstart")
    avg_ddelay = F.avg(F.when(F.col("result") == "k", F.col("ddone") - F.col("birth")))
    per_domain = _ddelay_columns(d.groupBy("domain").agg(
        F.count(F.lit(1)).alias("attempts"), F.sum(k).alias("success"),
        F.sum(fl).alias("failure"), F.sum(z).alias("deferral"),
        F.sum(xdelay).alias("xdelay"), avg_ddelay.alias("avg_ddelay"),
        F.expr(_DDELAY_P).alias("ddelay_p"),
        F.sum(F.when(F.col("result") == "k", F.col("bytes")).otherwise(0)).alias("sbytes")))
    sender = F.regexp_replace(F.col("sender"), r"^<(.*)>$", "$1")
    senders_m = m.withColumn("sender", sender).groupBy("sender").agg(
        F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"),
        F.sum(F.col("bytes") * F.col("nk")).alias("sbytes"),
        F.sum(F.col("bytes") * (F.col("nk") + F.col("nd"))).alias("rbytes"),
        F.sum(F.col("nk") + F.col("nd")).alias("recipients"),
        F.sum(F.col("nk") + F.col("nd") + F.col("nz")).alias("tries"))
    senders_d = d.withColumn("sender", sender).groupBy("sender").agg(
        F.sum(xdelay).alias("xdelay"), F.count(F.lit(1)).alias("attempts"),
        F.sum(k).alias("success"), F.sum(fl).alias("failure"), F.sum(z).alias("deferral"))
    per_sender = senders_m.join(senders_d, "sender", "full_outer").fillna(0)
    hour = lambda c: F.date_format(F.from_unixtime(F.floor(F.col(c))), "yyyy-MM-dd HH:00")
    by_hour_d = _ddelay_columns(d.groupBy(hour("ddone").alias("hour")).agg(
        F.count(F.lit(1)).alias("attempts"), F.sum(k).alias("success"),
        F.sum(fl).alias("failure"), F.sum(z).alias("deferral"),
        avg_ddelay.alias("avg_ddelay"), F.expr(_DDELAY_P).alias("ddelay_p")))
    by_hour_m = m.groupBy(hour("done").alias("hour")).agg(
        F.count(F.lit(1)).alias("completed"), F.sum("bytes").alias("bytes"))
    by_hour_new = occ.groupBy(hour("birth").alias("hour")).agg(
        F.count(F.lit(1)).alias("new_messages"))
    # counts of an hour without deliveries are 0; its delays stay null (none measured)
    counts = ["attempts", "success", "failure", "deferral", "completed", "bytes",
              "new_messages"]
    per_hour = by_hour_new.join(by_hour_d, "hour", "full_outer") \
        .join(by_hour_m, "hour", "full_outer").fillna(0, subset=counts)
    per_host = occ.groupBy("host").agg(
        F.count(F.lit(1)).alias("messages"),
        F.countDistinct("n").alias("numbers"),
        F.sum(F.when(F.col("ended"), 1).otherwise(0)).alias("ended"),
        F.sum("attempts").alias("attempts"), F.sum("successes").alias("success"),
        F.sum("failures").alias("failure"), F.sum("deferrals").alias("deferral"),
        F.sum("bounced").alias("bounces"))
    return {"per_domain": per_domain, "per_sender": per_sender, "per_hour": per_hour,
            "per_host": per_host}


def _occ_totals(occ):
    return occ.agg(
        F.count(F.lit(1)).alias("messages"),
        F.countDistinct("host", "n").alias("numbers"),
        F.sum(F.when(F.col("ended"), 1).otherwise(0)).alias("ended"),
        F.sum(F.when(F.col("orphan"), 1).otherwise(0)).alias("orphans"),
        F.sum("bounced").alias("bounces"), F.sum("triple").alias("triple_bounces"),
        F.min("birth").alias("t0"),
        F.max(F.greatest(F.col("birth"), F.coalesce(F.col("end_time"), F.col("birth"))))
        .alias("t1"))


def _delivery_totals(d):
    return d.agg(
        F.count(F.when(F.col("result") == "k", 1)).alias("k"),
        F.avg(F.when(F.col("result") == "k", F.col("ddone") - F.col("birth"))).alias("dd_avg"),
        F.max(F.when(F.col("result") == "k", F.col("ddone") - F.col("birth"))).alias("dd_max"),
        F.expr("percentile(CASE WHEN result = 'k' THEN ddone - birth END, "
               "array(0.5, 0.9, 0.99))").alias("dd_p"),
        F.count(F.lit(1)).alias("x"),
        F.avg(F.col("ddone") - F.col("dstart")).alias("x_avg"),
        F.max(F.col("ddone") - F.col("dstart")).alias("x_max"),
        F.expr("percentile(ddone - dstart, array(0.5, 0.9, 0.99))").alias("x_p"))


RESTORED_SHOWN = 1000       # messages restored after log damage, listed in full up to this


def compute(frames, line_counts):
    """(summary dict, summary DataFrames) of the audit. The DataFrames are persisted
    (made once here, for summaries.json, and written from memory after): the caller
    unpersists them."""
    occ, d, m, f = frames["occ"], frames["d"], frames["m"], frames["f"]
    tabs = {name: df.persist(StorageLevel.MEMORY_AND_DISK) for name, df in tables(frames).items()}
    order = {"per_domain": [F.desc("attempts"), F.asc("domain")],     # ties: by name, not
             "per_sender": [F.desc("messages"), F.asc("sender")],     # by partitioning
             "per_hour": [F.asc("hour")], "per_host": [F.asc("host")]}
    parts = {"o": _occ_totals(occ), "groups": _delivery_groups(d), "mr": _message_totals(m),
             "dr": _delivery_totals(d), "fk": f.groupBy("kind", "severity").count(),
             "examples": f.orderBy(F.col("severity") != "violation", "host", "n", "time")
             .limit(250),
             "restored": f.filter(F.col("kind") == "restored-after-damage")
             .orderBy("host", "n", "time").limit(RESTORED_SHOWN)}
    parts.update((name, df.orderBy(*order[name]).limit(TOP)) for name, df in tabs.items())
    got = _collect_together(parts)
    (o,), (mr,), (dr,) = got["o"], got["mr"], got["dr"]
    groups = [r.asDict() for r in got["groups"]]
    channels = {}
    for g in groups:
        c = channels.setdefault(g["channel"], {"attempts": 0, "success": 0, "failure": 0,
                                               "deferral": 0})
        c["attempts"] += g["count"]
        c[{"k": "success", "d": "failure", "z": "deferral"}[g["result"]]] += g["count"]
    delays = {"ddelay": _stats(dr["k"], dr["dd_avg"], dr["dd_max"], dr["dd_p"]),
              "xdelay": _stats(dr["x"], dr["x_avg"], dr["x_max"], dr["x_p"]),
              "qtime": _stats(mr["messages"], mr["qtime"] / mr["messages"] if mr["messages"]
                              else None, mr["qtime_max"], mr["qtime_p"])}
    fk = {r["kind"]: {"count": r["count"], "severity": r["severity"]} for r in got["fk"]}
    violations = sum(v["count"] for v in fk.values() if v["severity"] == "violation")
    examples = [_row(r) for r in got["examples"]]
    summary = {
        "log": {"lines": sum(v for k, v in line_counts.items() if ":" not in k),
                "by_kind": dict(sorted((k, v) for k, v in line_counts.items() if ":" not in k)),
                "ignored": dict(sorted((k[len("ignored:"):], v) for k, v in line_counts.items()
                                       if k.startswith("ignored:")))},
        "messages": {"messages": o["messages"], "numbers": o["numbers"], "ended": o["ended"] or 0,
                     "not_ended": o["messages"] - (o["ended"] or 0), "orphans": o["orphans"] or 0,
                     "bounces": o["bounces"] or 0, "triple_bounces": o["triple_bounces"] or 0,
                     "first_birth": o["t0"], "last_event": o["t1"]},
        "deliveries": {"by_channel": channels,
                       "matched_results": sum(g["count"] for g in groups)},
        "qmailanalog": qmailanalog(mr, groups),
        "delays": delays,
        "findings": {"total": sum(v["count"] for v in fk.values()), "violations": violations,
                     "by_kind": {k: v["count"] for k, v in sorted(fk.items())},
                     "severity": {k: v["severity"] for k, v in fk.items()},
                     "violation_examples": [e for e in examples
                                            if e["severity"] == "violation"][:200],
                     "notice_examples": [e for e in examples
                                         if e["severity"] != "violation"][:50],
                     "restored": [_row(r) for r in got["restored"]]},
    }
    for name in tabs:
        summary[name] = [_row(r) for r in got[name]]
    return summary, tabs


def plot_data(frames, summary, points=120):
    """Small series for the report's plots, computed in Spark and collected."""
    occ, d = frames["occ"], frames["d"]
    parts = {"hist": d.filter(F.col("result") == "k")
             .select(F.floor(F.log10(F.greatest(F.col("ddone") - F.col("birth"), F.lit(0.01))) * 4)
                     .alias("bin")).groupBy("bin").count()}
    queue = []
    t0, t1 = summary["messages"]["first_birth"], summary["messages"]["last_event"]
    if t0 is not None:
        t1 = max(t1, t0 + 1)
        width = (t1 - t0) / points
        bucket = lambda c: F.least(F.floor((F.col(c) - t0) / width), F.lit(points - 1))
        moves = occ.select(bucket("birth").alias("b"), F.lit(1).alias("v")).union(
            occ.filter(F.col("ended")).select(bucket("end_time").alias("b"),
                                              F.lit(-1).alias("v")))
        parts["change"] = moves.groupBy("b").agg(F.sum("v").alias("s"))
    got = _collect_together(parts)
    hist = got["hist"]
    if t0 is not None:
        change = dict((r["b"], r["s"]) for r in got["change"])
        size = 0
        for b in range(points):
            size += change.get(b, 0)
            queue.append((t0 + (b + 1) * width, size))
    delay_hist = sorted((r["bin"] / 4.0, r["count"]) for r in hist)
    domains = sorted(summary["per_domain"], key=lambda r: -(r["deferral"] + r["failure"]))
    domains = [(r["domain"], r["deferral"], r["failure"]) for r in domains
               if r["deferral"] + r["failure"]][:15]
    kinds = sorted(summary["findings"]["by_kind"].items(), key=lambda kv: -kv[1])
    return {"queue": queue, "delay_hist": delay_hist, "domains": domains, "findings": kinds}
