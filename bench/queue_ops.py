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
     info/S/n, remote/S/n.

Then, each in a fresh process: `qmailctl queue size` (wall time, best of 3), `qmail-qstat`,
`qmailctl queue list --recipient-domain d7.g7.example` and `qmailctl queue shape` (wall
time and peak RSS from wait4). On the log backend also after 10,000 more ENVELOPEs
appended behind the counters (qmail-queue while qmail-send is down).

With --delete (log), qmail-send is then started on that queue and `qmailctl queue
delete --recipient-domain .g3.example` removes a tenth of it through qmail-send's
command channel, with qmail-send's RSS before, at its peak and after.

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
    from qmailpy.backends import logrecords as R
    from qmailpy.backends.logcommit import LogWriter
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
            os.close(fd)


RECOVER = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from qmailpy.backends.logqueue import LogQueue
lq = LogQueue(sys.argv[1])
t = time.perf_counter()
lq.recover()
print("%.1f" % (time.perf_counter() - t))
"""


def measure(argv, env):
    """(wall seconds, peak RSS MiB, stdout) of one command in a fresh process."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit("%s failed (%d): %s" % (" ".join(argv), proc.returncode, err.decode()))
    return wall, usage.ru_maxrss / 1024, out


def report(home, label, walks=True):
    from qmailpy.ctl.queuesize import sizes
    env = dict(os.environ, QMAILHOME=home)
    ctl = os.path.join(BIN, "qmailctl")
    best = min(measure([ctl, "queue", "size"], env)[0] for _ in range(3))
    wall, rss, out = measure([ctl, "queue", "size"], env)
    print("  %-34s %6.3f s  %6.1f MiB   %s" % ("queue size" + label, best, rss,
                                            " ".join(out.decode().split())))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        sizes(home)
        times.append(time.perf_counter() - t)
    start = min(measure([sys.executable, "-c", "pass"], env)[0] for _ in range(3))
    print("  %-34s %6.3f s   (an interpreter starting: %.3f s)"
          % ("queue size in process" + label, min(times), start))
    wall, rss, out = measure([os.path.join(BIN, "qmail-qstat")], env)
    print("  %-34s %6.3f s  %6.1f MiB" % ("qmail-qstat" + label, wall, rss))
    if not walks:
        return
    wall, rss, out = measure([ctl, "queue", "list", "--recipient-domain", "d7.g7.example"], env)
    print("  %-34s %6.3f s  %6.1f MiB   %d messages listed"
          % ("queue list --recipient-domain" + label, wall, rss, out.count(b"#")))
    wall, rss, out = measure([ctl, "queue", "shape", "-n", "3"], env)
    print("  %-34s %6.3f s  %6.1f MiB" % ("queue shape -n 3" + label, wall, rss))


def delete_while_running(home):
    """qmail-send started on the filled log queue; `qmailctl queue delete` of a tenth of it
    (--recipient-domain .g3.example): wall time, and qmail-send's RSS before, at its peak
    during the delete (sampled every 50 ms) and after."""
    import psutil
    env = dict(os.environ, QMAILHOME=home)
    ctl = os.path.join(BIN, "qmailctl")
    subprocess.run([ctl, "start"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        with open(os.path.join(home, "log", "qmail-send.pid")) as f:
            send = psutil.Process(int(f.read()))
        t = time.perf_counter()
        log = os.path.join(home, "log", "qmail-send.log")
        while b"status: local" not in open(log, "rb").read():
            time.sleep(0.2)
        print("  qmail-send started and recovered in %.1f s" % (time.perf_counter() - t))
        before = send.memory_info().rss
        peak = [before]
        t = time.perf_counter()
        proc = subprocess.Popen([ctl, "queue", "delete", "--recipient-domain", ".g3.example",
                                 "--timeout", "7200"], env=env, stdout=subprocess.DEVNULL)

        def sample():
            while proc.poll() is None:
                peak[0] = max(peak[0], send.memory_info().rss)
                time.sleep(0.05)
        import threading
        sampler = threading.Thread(target=sample)
        sampler.start()
        proc.wait()
        sampler.join()
        wall = time.perf_counter() - t
        after = send.memory_info().rss
        deleted = open(log, "rb").read().count(b" delete msg ")
        print("  %-34s %6.1f s   %d deleted (exit %d); qmail-send RSS %.1f MiB before, "
              "%.1f peak, %.1f after" % ("queue delete (a tenth, running)", wall, deleted,
                                          proc.returncode, before / 2**20, peak[0] / 2**20,
                                          after / 2**20))
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
        if backend == "log":
            if delete:
                delete_while_running(home)
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
                   help="log: then start qmail-send and delete a tenth of the queue through it")
    args = p.parse_args()
    for backend in ("log", "dir") if args.backend == "both" else (args.backend,):
        bench(backend, args.messages or (1000000 if backend == "log" else 100000), args.keep,
              args.delete)


if __name__ == "__main__":
    main()
