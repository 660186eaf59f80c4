"""The audit on a standalone Spark cluster gives the findings of local mode.

    .venv/bin/python bench/cluster.py [--hosts 4] [--lines 40000] [--parser sql]

Starts a standalone master and two workers (one core each) from the pyspark
installation in this virtualenv (`spark-class org.apache.spark.deploy.master.Master`
and `...worker.Worker` on 127.0.0.1, their logs and work directories in a temporary
directory), generates a synthetic fleet (synthetic.generate_fleet, hosts relaying to
each other), runs `qmail-audit --fleet` on it once with --master local[2] and once
with --master spark://127.0.0.1:PORT, and compares the two runs' summaries.json and
findings row for row. Stops the master and workers it started, by pid. Exit 0 when
the runs agree, 1 when they differ.
"""
import argparse
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from qmailpy_audit import synthetic  # noqa: E402

VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
START_TIMEOUT = 120.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class():
    import pyspark
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def cluster_env(work):
    env = dict(os.environ)
    env.update({"SPARK_LOG_DIR": os.path.join(work, "logs"),
                "SPARK_WORKER_DIR": os.path.join(work, "work"),
                "SPARK_LOCAL_DIRS": os.path.join(work, "local"),
                "SPARK_LOCAL_IP": "127.0.0.1",
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    for key in ("SPARK_LOG_DIR", "SPARK_WORKER_DIR", "SPARK_LOCAL_DIRS"):
        os.makedirs(env[key], exist_ok=True)
    return env


def start(args, env, log_path):
    log = open(log_path, "wb")
    return subprocess.Popen([spark_class()] + args, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def master_state(ui_port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/json/" % ui_port, timeout=5) as r:
            return json.load(r)
    except OSError:
        return None


def wait_for_workers(ui_port, count, procs):
    """Wait until the master's status page lists `count` alive workers."""
    deadline = time.time() + START_TIMEOUT
    while time.time() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError("a cluster process exited with %d" % p.returncode)
        state = master_state(ui_port)
        if state and state.get("aliveworkers", 0) >= count:
            return state
        time.sleep(0.5)
    raise RuntimeError("the cluster did not come up within %.0f s" % START_TIMEOUT)


def stop(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def audit(master, inputs, fleet_map, out, parser, env):
    t = time.time()
    run = subprocess.run([os.path.join(VENV_BIN, "qmail-audit"), "--master", master,
                          "--out", out, "--fleet", fleet_map, "--parser", parser,
                          "--driver-memory", "2g"] + inputs,
                         env=env, capture_output=True, text=True)
    if run.returncode not in (0, 1):
        raise RuntimeError("qmail-audit on %s: exit %d\n%s" % (master, run.returncode,
                                                                run.stderr[-3000:]))
    return time.time() - t


def findings(out):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "findings.json", "part-*"))):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def summary(out):
    with open(os.path.join(out, "summaries.json")) as f:
        s = json.load(f)
    s.pop("inputs", None)
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--lines", type=int, default=40000)
    p.add_argument("--parser", choices=("python", "sql"), default="sql")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="qmail-audit-cluster-")
    env = cluster_env(work)
    fleet_dir = os.path.join(work, "fleet")
    messages = max(100, int(args.lines / 9.6 / args.hosts))
    text, _ = synthetic.generate_fleet(fleet_dir, hosts=args.hosts, messages=messages, seed=42)
    fleet_map = os.path.join(work, "fleet.map")
    with open(fleet_map, "w") as f:
        f.write(text)
    inputs = [os.path.join(fleet_dir, h) for h in sorted(os.listdir(fleet_dir))]
    port, ui_port = free_port(), free_port()
    procs = []
    try:
        t = time.time()
        procs.append(start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(port), "--webui-port", str(ui_port)], env,
                           os.path.join(work, "master.log")))
        for i in range(2):
            procs.append(start(["org.apache.spark.deploy.worker.Worker",
                                "spark://127.0.0.1:%d" % port, "--host", "127.0.0.1",
                                "--cores", "1", "--memory", "2g", "--webui-port", "0",
                                "--work-dir", os.path.join(work, "work", "w%d" % i)], env,
                               os.path.join(work, "worker%d.log" % i)))
        state = wait_for_workers(ui_port, 2, procs)
        print("cluster: master spark://127.0.0.1:%d, %d workers alive (%.1f s), pids %s"
              % (port, state["aliveworkers"], time.time() - t, [p.pid for p in procs]))
        local_out, cluster_out = os.path.join(work, "out-local"), os.path.join(work, "out-cluster")
        wall = audit("local[2]", inputs, fleet_map, local_out, args.parser, env)
        print("local[2]: %.1f s" % wall)
        wall = audit("spark://127.0.0.1:%d" % port, inputs, fleet_map, cluster_out, args.parser,
                     env)
        print("standalone cluster: %.1f s" % wall)
        apps = (master_state(ui_port) or {}).get("completedapps", [])
        print("applications the master ran: %d" % len(apps))
    finally:
        stop(procs)
    same_findings = findings(local_out) == findings(cluster_out)
    same_summary = summary(local_out) == summary(cluster_out)
    s = summary(local_out)
    print("%d lines, %d messages, findings %s" % (s["log"]["lines"], s["messages"]["messages"],
                                                  s["findings"]["by_kind"]))
    print("same findings: %s; same summaries.json (but its input list): %s"
          % (same_findings, same_summary))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("kept", work)
    return 0 if same_findings and same_summary else 1


if __name__ == "__main__":
    sys.exit(main())
