"""qmail-audit: audit qmail snapshots, logs and segments on Spark.

Exit 0 clean, 1 violations found, 2 bad input or a Spark failure; with --where, 0 when
the message was found, 1 when not, 2 as before.
The work is in qmailpy_audit.job (the spark/ folder); this module parses arguments and maps errors.
"""
import argparse
import json
import os
import sys

from qmailpy.states import DEFAULT_QUEUELIFETIME
from qmailpy_audit.fleet import DEFAULT_SKEW, read_map


def _parser():
    p = argparse.ArgumentParser(
        prog="qmail-audit",
        description="audit qmail queue snapshots, qmail-send logs and log-backend segments")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default local[*])")
    p.add_argument("--out", default="qmail-audit.out", metavar="DIR",
                   help="output directory (default ./qmail-audit.out)")
    p.add_argument("--host", action="append", default=[], metavar="NAME=PATH",
                   help="inputs at or below PATH belong to host NAME (repeatable)")
    p.add_argument("--queuelifetime", type=int, default=DEFAULT_QUEUELIFETIME, metavar="SECONDS",
                   help="queuelifetime of the logged hosts (default %d)" % DEFAULT_QUEUELIFETIME)
    p.add_argument("--lifetime-slack", type=float, default=3600.0, metavar="SECONDS",
                   help="grace after the last scheduled attempt before a message counts as "
                        "past its lifetime (default 3600)")
    p.add_argument("--fleet", default=None, metavar="MAP",
                   help="link hand-offs between the hosts MAP names (lines `name address...`) "
                        "into journeys")
    p.add_argument("--skew", type=float, default=DEFAULT_SKEW, metavar="SECONDS",
                   help="with --fleet: how far two hosts' clocks may differ (default %d)"
                        % DEFAULT_SKEW)
    p.add_argument("--where", default=None, metavar="KEY=VALUE",
                   help="print as JSON where the messages with sender=, recipient= or "
                        "message-id= VALUE are queued across the inputs' hosts (and, with "
                        "--fleet, their journeys)")
    p.add_argument("--parser", choices=("python", "sql"), default="python",
                   help="parse log lines in Python (default) or in the JVM with Spark SQL; "
                        "both give the same results")
    p.add_argument("--no-parquet", action="store_true", help="skip the Parquet outputs")
    p.add_argument("--incremental", action="store_true",
                   help="read only what is new since the run whose state is in DIR, and "
                        "report on everything audited so far")
    p.add_argument("--full", action="store_true",
                   help="with --incremental: read everything again, replacing the state")
    p.add_argument("--driver-memory", default="4g", metavar="SIZE",
                   help="heap of the Spark driver, which does all the work in local mode "
                        "(default 4g)")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="snapshot, log, segment file, directory, glob, URI or qmail home")
    return p


def session(master, app_name="qmail-audit", driver_memory=None):
    """A SparkSession with the UI off and the driver bound to SPARK_LOCAL_IP or 127.0.0.1.

    In local mode the driver does all the work: its heap (--driver-memory, default 4g)
    must hold the shuffles of a large log."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.appName(app_name) \
        .config("spark.ui.enabled", "false") \
        .config("spark.ui.showConsoleProgress", "false") \
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"]) \
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"]) \
        .config("spark.sql.session.timeZone", "UTC") \
        .config("spark.sql.shuffle.partitions", "8") \
        .config("spark.driver.memory", driver_memory or "4g")
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv=None, use_existing_master=False):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from qmailpy_audit.inputs import parse_host_map
        host_map = parse_host_map(args.host)
        fleet_map = None
        if args.fleet is not None:
            fleet_map = read_map(args.fleet)
        from qmailpy_audit.where import parse as parse_where
        where = None if args.where is None else parse_where(args.where)
    except ValueError as e:
        print("qmail-audit: %s" % e, file=sys.stderr)
        return 2
    import importlib.util
    for module in ("pyspark", "pyarrow"):      # the spark extra's
        if importlib.util.find_spec(module) is None:
            print("qmail-audit: %s is not installed (pip install 'qmailpy[spark]')" % module,
                  file=sys.stderr)
            return 2
    if args.full and not args.incremental:
        print("qmail-audit: --full goes with --incremental", file=sys.stderr)
        return 2
    if args.incremental and args.no_parquet:
        print("qmail-audit: --incremental keeps its state in Parquet: not with --no-parquet",
              file=sys.stderr)
        return 2
    if not args.incremental:
        return _audit(args, host_map, fleet_map, where, use_existing_master)
    from qmailpy_audit.incremental import Busy, lock
    if "://" in args.out:
        print("qmail-audit: --incremental keeps its state in a directory: --out %s is a URI"
              % args.out, file=sys.stderr)
        return 2
    try:
        held = lock(args.out)               # one run at a time; told before Spark starts
    except Busy as e:
        print("qmail-audit: %s; nothing was read or counted" % e, file=sys.stderr)
        return 2
    except OSError as e:
        print("qmail-audit: cannot lock %s: %s" % (args.out, e.strerror), file=sys.stderr)
        return 2
    try:
        return _audit(args, host_map, fleet_map, where, use_existing_master)
    finally:
        os.close(held)


def _audit(args, host_map, fleet_map, where, use_existing_master):
    from qmailpy_audit.incremental import StateError, load
    if args.incremental:
        try:
            load(args.out, args.full)       # a bad state is told before Spark starts
        except StateError as e:
            return _bad_state(e)
    master = args.master or (None if use_existing_master else "local[*]")
    spark = None
    try:
        from qmailpy_audit import job
        spark = session(master, driver_memory=args.driver_memory)
        opts = job.Options(host_map=host_map, queuelifetime=args.queuelifetime,
                           lifetime_slack=args.lifetime_slack,
                           write_parquet=not args.no_parquet, fleet_map=fleet_map,
                           skew=args.skew, parser=args.parser)
        opts.where = where
        opts.incremental, opts.full = args.incremental, args.full
        result = job.audit(spark, args.inputs, args.out, opts)
    except StateError as e:
        return _bad_state(e)
    except Exception as e:          # Py4J/Spark errors arrive as many exception types
        text = str(e).strip().splitlines()
        print("qmail-audit: Spark failed: %s" % (text[0] if text else e.__class__.__name__),
              file=sys.stderr)
        return 2
    finally:
        if spark is not None:
            spark.stop()
    if where is None:
        tell(result, args.out)
        return result.exit_code
    tell(result, args.out, stdout=sys.stderr)     # stdout is the JSON answer alone
    json.dump(result.where, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    if result.bad_count:
        return 2
    from qmailpy_audit.where import found
    return 0 if found(result.where) else 1


def _bad_state(e):
    print("qmail-audit: bad state: %s; nothing was read or counted (qmail-audit(8), "
          "INCREMENTAL RUNS: rerun with --full to audit everything again)" % e, file=sys.stderr)
    return 2


def tell(result, out, stdout=None, stderr=None):
    """What the command prints about a finished audit."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    for text in result.warnings:
        print("qmail-audit: warning: %s" % text, file=stderr)
    for bad in result.bad_inputs:
        example = bad["examples"][0] if bad["examples"] else {}
        print("qmail-audit: bad input: %d x %s%s" % (
            bad["count"], bad["kind"],
            " (e.g. %s: %s)" % (example.get("path"), example.get("detail")) if example else ""),
            file=stderr)
    for kind, count in sorted(result.findings_by_kind.items()):
        print("qmail-audit: %s: %d" % (kind, count), file=stderr)
    print("qmail-audit: %d violation(s); report: %s" % (
        result.violations, os.path.join(os.path.abspath(out), "report.html")), file=stdout)


if __name__ == "__main__":      # run as a file: by spark-submit, which chose the master
    sys.exit(main(use_existing_master=True))
