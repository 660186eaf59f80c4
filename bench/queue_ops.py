#!/usr/bin/env python3
"""qmailctl queue size / list / shape on a big queue (issue 14's scale figures).

log  N messages (default 1,000,000) appended through the log backend's own appender
     (LogWriter.append, batches of 1000): per message the ENVELOPE qmail-queue writes
     and the PREPROCESSED qmail-send writes after it (prev = the ENVELOPE), one remote
     recipient at one of 1000 domains, due in a year. Then LogQueue.recover() in a fresh
     process, as qmail-send's first start does (flags the ENVELOPEs garbage, counts every
     message once, writes the checkpoint and queue/log/counts). Bodies are not written:
     nothing measured here reads mess/ for a preprocessed message.
dir  N messages (default 100,000) as qmail's files: mess/S/n (empty; n its inode),
     info/S/n, remote/S/n (its mtime, the next attempt, in a year).

Then, each in a fresh process, through HOME/bin's launchers as an administrator runs them:
`qmailctl queue size` and `qmail-qstat` (wall time, min and median of RUNS; queue size
also through pip's console script), `qmailctl queue list --recipient-domain
d7.g7.example`, `list --json` of everything and `qmailctl queue shape` (wall time and
peak RSS from wait4). On the log backend also after 10,000 more ENVELOPEs appended
behind the counters (qmail-queue while qmail-send is down).

With --delete, qmail-send is then started on that queue and `qmailctl queue delete
--recipient-domain .gK.example ...` removes 100,000 messages (the whole queue when it is
smaller) through qmail-send's command channel: wall time, qmail-send's RSS before, at its
peak and after, and the wait of a local delivery queued while the delete runs.

Usage: .venv/bin/python bench/queue_ops.py [log|dir|both] [--messages N] [--keep] [--delete]
(BENCH_DIR chooses where the home is made.)
"""
import argparse
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BIN = os.path.dirname(os.path.abspath(sys.executable))
DOMAINS = 1000
GROUPS = 10
BATCH = 1000
RUNS = 9            # runs of each short command timed (min and median: the host may be busy)


def rcpt(n):
    """One of DOMAINS domains, in GROUPS groups: --recipient-domain .gK.example matches a tenth."""
    return b"rcpt%d@d%d.g%d.example" % (n, n % DOMAINS, n % DOMAINS % GROUPS)


def make_home(backend):
    base = tempfile.mkdtemp(prefix="qmailpy-bench-", dir=os.environ.get("BENCH_DIR"))
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(home, "control", "queuebackend"), "w") as f:
        f.write(backend + "\n")
    return base, home


def fill_log(home, count, first=1000000, preprocess=True):
    from qmailpy.backends.log import records as R
    from qmailpy.backends.log.commit import LogWriter
    writer = LogWriter(os.path.join(home, "queue", "log"))
    now = int(time.time())
    for start in range(0, count, BATCH):
        numbers = range(first + start, first + min(count, start + BATCH))
        envelopes = [R.encode_envelope(now, n, 1000, 4242, b"sender%d@bench.example" % n,
                                       [rcpt(n)]) for n in numbers]
        seg, offset = writer.append(b"".join(envelopes))
        if not preprocess:
            continue
        snapshots = []
        for n, env in zip(numbers, envelopes):
            snapshots.append(R.encode_snapshot(
                R.PREPROCESSED, now, n, (seg, offset), now, 4242, 1000, 2100,
                b"sender%d@bench.example" % n, b"", (),
                {"remote": (now + 365 * 86400, [(False, rcpt(n))])}))
            offset += len(env)
        writer.append(b"".join(snapshots))
    writer.sync_all()
    writer.close()


def fill_dir(home, count):
    queue = os.path.join(home, "queue")
    later = time.time() + 365 * 86400
    tmp = os.path.join(queue, "mess", "0", "bench.tmp")
    for i in range(count):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        n = os.fstat(fd).st_ino
        os.close(fd)
        s = n % 23
        os.rename(tmp, "%s/mess/%d/%d" % (queue, s, n))
        for kind, data in (("info", b"Fsender%d@bench.example\0" % n),
                           ("remote", b"T" + rcpt(n) + b"\0")):
            fd = os.open("%s/%s/%d/%d" % (queue, kind, s, n), os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, data)
            if kind == "remote":            # its next attempt (qmail's place for it): in a year
                os.utime(fd, (later, later))
            os.close(fd)


RECOVER = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from qmailpy.backends.log.queue import LogQueue
lq = LogQueue(sys.argv[1])
t = time.perf_counter()
lq.recover()
print("%.1f" % (time.perf_counter() - t))
"""


def measure(argv, env, peak=True):
    """(wall seconds, peak RSS MiB or None, Output) of one command in a fresh process. The
    peak is GNU time's (%M): a child's own ru_maxrss would start from this process's size,
    which Linux carries over the exec of a spawned child."""
    with tempfile.NamedTemporaryFile("r") as rss:
        t = time.perf_counter()
        proc = subprocess.Popen((["/usr/bin/time", "-o", rss.name, "-f", "%M"] if peak else []) + argv,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = Output()
        while True:
            chunk = proc.stdout.read(1 << 16)
            if not chunk:
                break
            out.add(chunk)
        err = proc.stderr.read()
        proc.wait()
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit("%s failed (%d): %s" % (" ".join(argv), proc.returncode, err.decode()))
        return wall, int(rss.read().split()[-1]) / 1024 if peak else None, out


class Output:
    """A command's output, counted, not kept: its first 4 KiB, its lines, its '#'s."""

    def __init__(self):
        self.head, self.lines, self.hashes = b"", 0, 0

    def add(self, chunk):
        if len(self.head) < 4096:
            self.head += chunk[:4096 - len(self.head)]
        self.lines += chunk.count(b"\n")
        self.hashes += chunk.count(b"#")

    def decode(self):
        return self.head.decode()


def timed(argv, env, runs=RUNS):
    """(min, median) wall seconds of `runs` runs, the last run's peak RSS and stdout."""
    walls = sorted(measure(argv, env, peak=False)[0] for _ in range(runs))
    _, rss, out = measure(argv, env)
    return walls[0], walls[len(walls) // 2], rss, out


def report(home, label, walks=True):
    """qmailctl and qmail-qstat as an administrator runs them: HOME/bin's launchers
    (python -IS, qmailctl(8) "init"); queue size also through pip's console script."""
    from qmailpy.ctl.queuesize import sizes
    env = dict(os.environ, QMAILHOME=home)
    ctl = os.path.join(home, "bin", "qmailctl")
    low, mid, rss, out = timed([ctl, "queue", "size"], env)
    print("  %-34s %6.3f s min, %.3f median of %d  %6.1f MiB   %s" % (
        "queue size" + label, low, mid, RUNS, rss, " ".join(out.decode().split())))
    low, mid, rss, out = timed([os.path.join(BIN, "qmailctl"), "queue", "size"], env)
    print("  %-34s %6.3f s min, %.3f median  (pip's script: site and the editable finder)"
          % ("queue size" + label, low, mid))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        sizes(home)
        times.append(time.perf_counter() - t)
    low, mid, _, _ = timed([sys.executable, "-IS", "-c", "pass"], env)
    print("  %-34s %6.3f s   (python -IS starting: %.3f s min, %.3f median)"
          % ("queue size in process" + label, min(times), low, mid))
    low, mid, rss, out = timed([os.path.join(home, "bin", "qmail-qstat")], env)
    print("  %-34s %6.3f s min, %.3f median  %6.1f MiB" % ("qmail-qstat" + label, low, mid, rss))
    if not walks:
        return
    wall, rss, out = measure([ctl, "queue", "list", "--recipient-domain", "d7.g7.example"], env)
    print("  %-34s %6.3f s  %6.1f MiB   %d messages listed"
          % ("queue list --recipient-domain" + label, wall, rss, out.hashes))
    wall, rss, out = measure([ctl, "queue", "list", "--json"], env)
    print("  %-34s %6.3f s  %6.1f MiB   %d messages listed"
          % ("queue list --json (all)" + label, wall, rss, out.lines))
    wall, rss, out = measure([ctl, "queue", "shape", "-n", "3"], env)
    print("  %-34s %6.3f s  %6.1f MiB" % ("queue shape -n 3" + label, wall, rss))


def _wait_log(log, needle, timeout=3600):
    deadline = time.monotonic() + timeout
    while needle not in open(log, "rb").read():
        if time.monotonic() > deadline:
            raise SystemExit("no %r in %s" % (needle, log))
        time.sleep(0.05)


def _probe(home, env):
    """Queue one local message (to a user that does not exist: it fails at once, and its
    null sender's bounce is dropped); seconds until qmail-send logs its delivery result."""
    log = os.path.join(home, "log", "qmail-send.log")
    before = open(log, "rb").read().count(b"\n")
    t = time.perf_counter()
    subprocess.run([os.path.join(home, "bin", "qmail-inject"), "-f", "", "probe-nobody@bench.example"],
                   input=b"Subject: probe\n\nprobe\n", env=env, check=True)
    while True:
        lines = open(log, "rb").read().split(b"\n")[before:]
        d = [l.split(b"starting delivery ")[1].split(b":")[0] for l in lines
             if b"starting delivery " in l and l.endswith(b" probe-nobody@bench.example")]
        if d and any((b"delivery %s: " % d[0]) in l for l in lines):
            return time.perf_counter() - t
        time.sleep(0.02)


def delete_while_running(home, count):
    """qmail-send started on the filled queue; `qmailctl queue delete` of 100,000 messages
    (or the whole queue when smaller), selected by their recipient domain groups (a tenth of
    the queue each, .gK.example): wall time; qmail-send's RSS before, at its peak (sampled
    every 50 ms) and after; and how long a local message queued meanwhile waits for its
    delivery (qmail-send goes on working between the command's steps)."""
    import psutil
    import threading
    env = dict(os.environ, QMAILHOME=home)
    ctl = os.path.join(home, "bin", "qmailctl")
    groups = min(GROUPS, -(-100000 * GROUPS // count))
    subprocess.run([ctl, "start"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        with open(os.path.join(home, "log", "qmail-send.pid")) as f:
            send = psutil.Process(int(f.read()))
        log = os.path.join(home, "log", "qmail-send.log")
        t = time.perf_counter()
        _wait_log(log, b"status: local")
        print("  qmail-send started and recovered in %.1f s" % (time.perf_counter() - t))
        time.sleep(10)                      # its first runner walks, metrics and checkpoint
        idle = _probe(home, env)
        before = send.memory_info().rss
        peak = [before]
        argv = [ctl, "queue", "delete", "--timeout", "7200"]
        for k in range(groups):
            argv += ["--recipient-domain", ".g%d.example" % ((3 + k) % GROUPS)]
        t = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)

        def sample():
            while proc.poll() is None:
                peak[0] = max(peak[0], send.memory_info().rss)
                time.sleep(0.05)
        sampler = threading.Thread(target=sample)
        sampler.start()
        cdir = os.path.join(home, "queue", "command")
        while proc.poll() is None and not any(n.endswith(".work") for n in os.listdir(cdir)):
            time.sleep(0.05)
        claimed = time.perf_counter() - t
        busy = _probe(home, env) if proc.poll() is None else None
        proc.wait()
        sampler.join()
        wall = time.perf_counter() - t
        after = send.memory_info().rss
        deleted = open(log, "rb").read().count(b" delete msg ")
        print("  %-34s %6.1f s   %d deleted (exit %d; qmailctl's selection %.1f s); qmail-send RSS "
              "%.1f MiB before, %.1f peak, %.1f after" % (
                  "queue delete (running)", wall, deleted, proc.returncode, claimed,
                  before / 2**20, peak[0] / 2**20, after / 2**20))
        print("  %-34s %6.2f s idle, %s during the delete" % (
            "a local delivery's wait", idle, "%.2f s" % busy if busy is not None else "(over before)"))
    finally:
        subprocess.run([ctl, "stop"], env=env, stdout=subprocess.DEVNULL)


def bench(backend, count, keep, delete):
    base, home = make_home(backend)
    try:
        t = time.perf_counter()
        (fill_log if backend == "log" else fill_dir)(home, count)
        print("%s backend: %d messages filled in %.1f s" % (backend, count, time.perf_counter() - t))
        if backend == "log":
            done = subprocess.run([sys.executable, "-c", RECOVER, home, ROOT], check=True,
                                  capture_output=True, text=True)
            print("  qmail-send's first recovery (flags, counts, checkpoint): %s s"
                  % done.stdout.strip())
        report(home, "")
        if delete:
            delete_while_running(home, count)
        if backend == "log":
            fill_log(home, 10000, first=5000000, preprocess=False)
            report(home, " (+10k after counters)", walks=False)
    finally:
        if keep:
            print("kept", home)
        else:
            shutil.rmtree(base, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("backend", nargs="?", default="both", choices=("log", "dir", "both"))
    p.add_argument("--messages", type=int, help="messages to fill (log 1,000,000; dir 100,000)")
    p.add_argument("--keep", action="store_true", help="keep the home")
    p.add_argument("--delete", action="store_true",
                   help="then start qmail-send and delete 100,000 messages (at most the queue) through it")
    args = p.parse_args()
    for backend in ("log", "dir") if args.backend == "both" else (args.backend,):
        bench(backend, args.messages or (1000000 if backend == "log" else 100000), args.keep,
              args.delete)


if __name__ == "__main__":
    main()
