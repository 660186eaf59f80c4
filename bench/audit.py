"""Audit throughput: a generated qmail-send log and a generated snapshot on local[2].

    .venv/bin/python bench/audit.py [--lines 10000000] [--messages 1000000] [--dir DIR]
    .venv/bin/python bench/audit.py --hosts 20 [--lines 10000000] [--parser both]

Generates (or reuses, when present with the same sizes) a qmail-send log of
about --lines lines and a snapshot of --messages messages, then audits both on
local[2] and prints Spark start-up, audit wall time and lines/s separately.

With --hosts N: a fleet of N hosts' logs of --lines lines in all, each host handing
some of its remote deliveries to the next (synthetic.generate_fleet), audited with
--fleet's map by each --parser (python: every line parsed and every message checked in
Python; sql: lines parsed and the common messages checked in the JVM; both: one after
the other in the same run), printing lines/s of each, how many messages the JVM
checked, the load average (5 minutes) at its end, and whether their findings and
figures agree.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from qmailpy import snapshot_format  # noqa: E402
from qmailpy_audit import synthetic  # noqa: E402

LINES_PER_MESSAGE = 9.6         # what synthetic.generate writes on average


def make_log(path, lines):
    messages = max(100, int(lines / LINES_PER_MESSAGE))
    expect = synthetic.generate(path, messages=messages, seed=42, style="tai64n", host="bench",
                                pool=50000)
    return sum(expect.lines.values())


def make_snapshot(path, messages, taken):
    with open(path, "w", encoding="utf-8") as out:
        snapshot_format.write([snapshot_format.header("bench-q", "/var/qmail", "dir", taken,
                                                      604800)], out)
        for i in range(messages):
            n = 1000000 + i
            birth = taken - 3600 - (i % 86400)
            files = {kind: {"path": "%s/%d/%d" % (kind, n % 23, n), "split": n % 23,
                            "size": 2000, "mtime": birth, "atime": birth, "inode": n,
                            "mode": 0o600, "links": 1} for kind in ("mess", "info", "remote")}
            rec = snapshot_format.message_record(
                "bench-q", n, "dir", files, "sender%d@example.org" % (i % 100),
                [snapshot_format.recipient("remote", "r%d@example.net" % i, i % 3 == 0)])
            out.write(snapshot_format.dumps(rec) + "\n")
        out.write(snapshot_format.dumps(snapshot_format.trailer("bench-q", messages)) + "\n")


def make_fleet(directory, hosts, lines):
    messages = max(100, int(lines / LINES_PER_MESSAGE / hosts))
    text, _expects = synthetic.generate_fleet(directory, hosts=hosts, messages=messages, seed=42)
    with open(os.path.join(directory, "fleet.map"), "w") as f:
        f.write(text)


def count_lines(path):
    with open(path, "rb") as f:
        return sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 20), b""))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=10_000_000)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--dir", default="/tmp/qmail-audit-bench")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="8g")
    p.add_argument("--hosts", type=int, default=0, help="a fleet of this many hosts")
    p.add_argument("--parser", choices=("python", "sql", "both"), default="both",
                   help="with --hosts: which log parser to measure")
    args = p.parse_args()
    if args.hosts:
        return fleet_main(args)
    os.makedirs(os.path.join(args.dir, "bench"), exist_ok=True)
    log = os.path.join(args.dir, "bench", "qmail-send-%d.log" % args.lines)
    snap = os.path.join(args.dir, "snapshot-%d.jsonl" % args.messages)
    if not os.path.exists(log):
        t = time.time()
        make_log(log + ".tmp", args.lines)
        os.rename(log + ".tmp", log)
        print("generated log: %.1f s" % (time.time() - t))
    if not os.path.exists(snap):
        t = time.time()
        make_snapshot(snap + ".tmp", args.messages, time.time())
        os.rename(snap + ".tmp", snap)
        print("generated snapshot: %.1f s" % (time.time() - t))
    lines = count_lines(log)

    from qmailpy.cli.qmail_audit import session
    from qmailpy_audit import job
    t0 = time.time()
    spark = session(args.master, "qmail-audit-bench", driver_memory=args.driver_memory)
    spark.sparkContext.parallelize([0], 1).count()       # the JVM and one Python worker up
    startup = time.time() - t0
    out = os.path.join(args.dir, "out")
    t1 = time.time()
    result = job.audit(spark, [log], out + "-log", job.Options(write_parquet=True))
    log_wall = time.time() - t1
    t2 = time.time()
    snap_result = job.audit(spark, [snap], out + "-snapshot", job.Options(write_parquet=True))
    snap_wall = time.time() - t2
    spark.stop()
    s = result.summary
    print("master %s, %d cores" % (args.master, os.cpu_count()))
    print("spark start-up:           %8.1f s" % startup)
    print("log audit:                %8.1f s  %d lines  %.0f lines/s  (%d messages, %d "
          "deliveries, findings %s)" % (log_wall, lines, lines / log_wall,
                                        s["messages"]["messages"],
                                        s["qmailanalog"]["delivery_attempts"],
                                        result.findings_by_kind))
    print("snapshot audit:           %8.1f s  %d messages  %.0f messages/s (findings %s)"
          % (snap_wall, args.messages, args.messages / snap_wall,
             snap_result.findings_by_kind))


def fleet_main(args):
    from qmailpy_audit.fleet import read_map
    directory = os.path.join(args.dir, "fleet-%d-%d" % (args.hosts, args.lines))
    if not os.path.exists(os.path.join(directory, "fleet.map")):
        t = time.time()
        make_fleet(directory + ".tmp", args.hosts, args.lines)
        os.rename(directory + ".tmp", directory)
        print("generated fleet: %.1f s" % (time.time() - t))
    logs = os.path.join(directory, "logs")
    if not os.path.isdir(logs):
        os.makedirs(logs)
        for name in sorted(os.listdir(directory)):
            if os.path.isdir(os.path.join(directory, name)) and name != "logs":
                os.rename(os.path.join(directory, name), os.path.join(logs, name))
    hosts = [os.path.join(logs, h) for h in sorted(os.listdir(logs))]   # one argument per host
    lines = sum(count_lines(os.path.join(h, "current")) for h in hosts)
    fleet_map = read_map(os.path.join(directory, "fleet.map"))

    from qmailpy.cli.qmail_audit import session
    from qmailpy_audit import job
    t0 = time.time()
    spark = session(args.master, "qmail-audit-bench", driver_memory=args.driver_memory)
    spark.sparkContext.parallelize([0], 1).count()
    print("master %s, %d cores, %d hosts, %d lines; spark start-up %.1f s"
          % (args.master, os.cpu_count(), args.hosts, lines, time.time() - t0))
    results = {}
    for parser in (("python", "sql") if args.parser == "both" else (args.parser,)):
        t = time.time()
        result = job.audit(spark, hosts, os.path.join(args.dir, "out-fleet-" + parser),
                           job.Options(write_parquet=True, fleet_map=fleet_map, parser=parser))
        wall = time.time() - t
        results[parser] = result
        s = result.summary
        print("%-6s parser: %8.1f s  %d lines  %.0f lines/s  load %.1f  (%d messages, %d checked "
              "in the JVM, %d deliveries, %d journeys, %d of %d hand-offs linked, findings %s)"
              % (parser, wall, lines, lines / wall, os.getloadavg()[1], s["messages"]["messages"],
                 result.checked_in_jvm, s["qmailanalog"]["delivery_attempts"],
                 s["fleet"]["journeys"], s["fleet"]["linked"], s["fleet"]["handoffs"],
                 result.findings_by_kind))
    spark.stop()
    if len(results) == 2:
        same = results["python"].summary == results["sql"].summary
        print("python and sql parsers give the same summaries.json: %s" % same)


if __name__ == "__main__":
    main()
