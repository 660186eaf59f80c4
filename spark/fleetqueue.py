"""The fleet's queue (issue 26 point 3): what the latest snapshot of every host holds, by
host x recipient domain x age x state, and the oldest messages fleet-wide
(docs/architecture.md "The audit", qmail-audit(8) "FLEET QUEUE").

A message counts once in each recipient domain it still has pending recipients in, as
qshape(1) counts it (bytes likewise); a message with none pending (a leftover, or one
only waiting for qmail-clean) counts under the domain null. Its age is the snapshot's
time minus its birth (the mtime of info; before preprocessing, of mess).
"""
import heapq

from pyspark.sql import types as T

OLDEST = 20                    # messages in the fleet-wide oldest list
LARGEST = 50                   # rows of the table in summaries.json and the report
AGE_BUCKETS = ((300, "0-5m"), (3600, "5m-1h"), (6 * 3600, "1h-6h"), (86400, "6h-1d"),
               (3 * 86400, "1d-3d"), (7 * 86400, "3d-7d"), (None, "7d+"))
AGE_ORDER = [name for _limit, name in AGE_BUCKETS] + ["unknown"]
TABLE_SCHEMA = T.StructType([
    T.StructField("host", T.StringType()), T.StructField("domain", T.StringType()),
    T.StructField("age", T.StringType()), T.StructField("state", T.StringType()),
    T.StructField("messages", T.LongType()), T.StructField("recipients", T.LongType()),
    T.StructField("bytes", T.LongType()),
])


def latest(snapshots):
    """{host: (taken, records RDD)} of the newest of each host's snapshots.
    snapshots: [(host, taken, records RDD)] in input order."""
    out = {}
    for host, taken, records in snapshots:
        if host not in out or taken > out[host][0]:
            out[host] = (taken, records)
    return out


def since(rec):
    """When the message entered its host's queue, as the snapshot tells, or None."""
    if rec.get("birth") is not None:
        return rec["birth"]
    return (rec["files"].get("mess") or {}).get("mtime")


def age_bucket(age):
    if age is None:
        return "unknown"
    for limit, name in AGE_BUCKETS:
        if limit is None or age < limit:
            return name


def pending(rec):
    return [r["address"] for r in rec["recipients"] if not r["done"]]


def domain(address):
    at = address.rfind("@")
    return address[at + 1:].lower() if at >= 0 else ""


def state(rec):
    return rec.get("state") or "unknown"


def table_items(rec, taken):
    """((host, domain, age, state), (messages, recipients, bytes)) of one message record."""
    per_domain = {}
    for address in pending(rec):
        d = domain(address)
        per_domain[d] = per_domain.get(d, 0) + 1
    start = since(rec)
    age = age_bucket(None if start is None else taken - start)
    size = rec.get("size") or 0
    return [((rec["host"], d, age, state(rec)), (1, count, size))
            for d, count in (per_domain or {None: 0}).items()]


def entry(rec, taken):
    """Where one message is now, as its host's latest snapshot shows it."""
    start = since(rec)
    return {"host": rec["host"], "n": rec["n"], "state": state(rec), "birth": start,
            "age": None if start is None else taken - start, "snapshot_taken": taken,
            "size": rec.get("size"), "sender": rec.get("sender"),
            "message_id": rec.get("message_id"), "recipients_left": pending(rec)}


def _add(a, b):
    return tuple(x + y for x, y in zip(a, b))


def message_items(rec, taken):
    """((host, state, age), (messages, recipients, bytes)) of one message record: each
    message once, whatever its domains."""
    start = since(rec)
    return ((rec["host"], state(rec), age_bucket(None if start is None else taken - start)),
            (1, len(pending(rec)), rec.get("size") or 0))


def _oldest_key(tr):
    return since(tr[1]), tr[1]["host"], tr[1]["n"]


def _merge(sums, more):
    for key, value in more.items():
        sums[key] = _add(sums[key], value) if key in sums else value


def _partial(pairs, oldest):
    """(table items, message totals, its `oldest` oldest (taken, record)) of one partition
    of (taken, record): one pass, and one Spark job for the three."""
    items, totals, dated = {}, {}, []
    for taken, rec in pairs:
        _merge(items, dict(table_items(rec, taken)))
        key, value = message_items(rec, taken)
        _merge(totals, {key: value})
        if since(rec) is not None:
            dated.append((taken, rec))
            if len(dated) > oldest + 10000:         # a partition's records need not fit
                dated = heapq.nsmallest(oldest, dated, key=_oldest_key)
    return items, totals, heapq.nsmallest(oldest, dated, key=_oldest_key)


class FleetQueue:
    """The fleet queue over the latest snapshot of each host (computed on Spark)."""

    def __init__(self, sc, snapshots, oldest=OLDEST):
        self.taken = {}
        rdds = []
        for host, (taken, records) in sorted(latest(snapshots).items()):
            self.taken[host] = taken
            rdds.append(records.map(lambda r, t=taken: (t, r)))
        self.records = sc.union(rdds) if rdds else None
        self.rows, self.totals, self.oldest = [], [], []
        if self.records is None:
            return
        items, totals, first = {}, {}, []
        for part in self.records.mapPartitions(lambda it: [_partial(it, oldest)]).collect():
            _merge(items, part[0])
            _merge(totals, part[1])
            first += part[2]
        self.rows = sorted((k + v for k, v in items.items()),
                           key=lambda r: (r[0], r[1] is None, r[1] or "",
                                          AGE_ORDER.index(r[2]), r[3]))
        self.totals = list(totals.items())
        self.oldest = [entry(r, t) for t, r in heapq.nsmallest(oldest, first, key=_oldest_key)]

    def find(self, predicate):
        """entry() of every message record for which predicate(record) holds."""
        if self.records is None:
            return []
        found = self.records.filter(lambda tr: predicate(tr[1])).collect()
        return sorted((entry(r, t) for t, r in found), key=lambda e: (e["host"], e["n"]))

    def write(self, spark, uri):
        spark.createDataFrame(self.rows, TABLE_SCHEMA).write.mode("overwrite").parquet(uri)

    def table(self):
        return [dict(zip(TABLE_SCHEMA.names, row)) for row in self.rows]

    def summary(self):
        """summaries.json's fleet_queue: messages, pending recipients and bytes per host,
        messages per state and per age, the size of the table, the oldest messages."""
        hosts = {h: {"host": h, "snapshot_taken": t, "messages": 0, "recipients": 0,
                     "bytes": 0} for h, t in self.taken.items()}
        by_state, by_age = {}, {}
        for (host, st, age), (messages, recipients, size) in self.totals:
            total = hosts.setdefault(host, {"host": host, "snapshot_taken": None, "messages": 0,
                                            "recipients": 0, "bytes": 0})
            total["messages"] += messages
            total["recipients"] += recipients
            total["bytes"] += size
            by_state[st] = by_state.get(st, 0) + messages
            by_age[age] = by_age.get(age, 0) + messages
        return {"hosts": [hosts[h] for h in sorted(hosts)],
                "messages": sum(h["messages"] for h in hosts.values()),
                "by_state": dict(sorted(by_state.items())),
                "by_age": {a: by_age[a] for a in AGE_ORDER if a in by_age},
                "table_rows": len(self.rows), "oldest": self.oldest,
                "largest": sorted(self.table(), key=lambda r: -r["messages"])[:LARGEST]}
