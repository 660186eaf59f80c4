#!/usr/bin/env python3
"""Log-structured queue backend: injection, fsyncs, qmail-send memory, restart time.

  inject   N messages queued by W concurrent forked workers, on the directory backend
           (qmailpy.queue.qmailqueue.run: mess + intd + todo, its fsyncs) and on the log backend
           (same body write, then one group-committed ENVELOPE append). Prints messages/s and
           fsyncs per message (every os.fsync in the workers counted).
  send     qmail-send's side on the same N: preprocess, one delivery, completion, through
           each backend's interface (dir with a real qmail-clean); messages/s and fsyncs.
  memory   For 10k / 100k / 1M deferred messages in the log: RSS of a process that recovers
           the queue and lets every queue runner walk the whole log (what qmail-send holds).
  restart  SIGKILL a process working on a 1M-message log, then time recovery in a fresh
           process (LogQueue.recover(): checkpoint + working suffix + reconciliation), and
           the directory backend's startup scan of 10k / 100k preprocessed messages beside it.
  crc      crc32c package vs the pure-Python CRC-32C on record-sized buffers.

Usage: .venv/bin/python bench/logqueue.py [inject|send|memory|restart|crc|all] [--messages N]
       [--workers W] [--sizes 10000,100000,1000000]
"""
import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BIN = os.path.dirname(os.path.abspath(sys.executable))
MESSAGE = b"From: bench@bench.example\nTo: rcpt@bench.example\nSubject: bench\n\n" + b"x" * 2000 + b"\n"


def make_home():
    base = tempfile.mkdtemp(prefix="qmailpy-bench-", dir=os.environ.get("BENCH_DIR"))
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    logdir = os.path.join(home, "queue", "log")
    os.makedirs(logdir, exist_ok=True)
    st = os.stat(os.path.join(home, "queue", "mess"))
    os.chown(logdir, st.st_uid, st.st_gid)
    return base, home


# --- injection ------------------------------------------------------------------

def _worker(home, backend, count, report_w):
    """Forked child: queue `count` messages, report (fsyncs) on report_w, exit."""
    from qmailpy import privs
    fsyncs = [0]
    real_fsync = os.fsync

    def counting_fsync(fd):
        fsyncs[0] += 1
        return real_fsync(fd)
    os.fsync = counting_fsync
    queue = os.path.join(home, "queue")
    if backend == "dir":
        from qmailpy.queue import qmailqueue
        env = b"Fbench@bench.example\0Trcpt@bench.example\0\0"
        for _ in range(count):
            mr, mw = os.pipe()
            er, ew = os.pipe()
            os.write(mw, MESSAGE)
            os.close(mw)
            os.write(ew, env)
            os.close(ew)
            code = qmailqueue._Queue(home, mr, er).run()
            os.close(mr)
            os.close(er)
            os.chdir(ROOT)
            if code:
                os._exit(code)
    else:
        from qmailpy.backends.log.commit import LogWriter
        from qmailpy.backends.log.enqueue import enqueue
        import importlib
        for name in ("qmailpy.envelope", "qmailpy.trigger"):
            importlib.import_module(name)          # while still root: the interpreter may be unreadable after
        privs.become(home, "qmailq")
        writer = LogWriter(os.path.join(queue, "log"))
        for _ in range(count):
            enqueue(queue, MESSAGE, b"bench@bench.example", [b"rcpt@bench.example"], writer=writer)
    os.write(report_w, b"%d\n" % fsyncs[0])
    os._exit(0)


def inject(backend, messages, workers, home=None):
    base = None
    if home is None:
        base, home = make_home()
    try:
        r, w = os.pipe()
        start = time.perf_counter()
        pids = []
        for i in range(workers):
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    _worker(home, backend, messages // workers, w)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    sys.stderr.flush()
                finally:
                    os._exit(99)
            pids.append(pid)
        os.close(w)
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status):
                raise SystemExit("%s worker failed: %d" % (backend, os.waitstatus_to_exitcode(status)))
        elapsed = time.perf_counter() - start
        with os.fdopen(r, "rb") as f:
            fsyncs = sum(int(x) for x in f.read().split())
        total = workers * (messages // workers)
        return total / elapsed, fsyncs / total
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


def bench_inject(args):
    print("injection: %d messages, %d concurrent workers (forked; no interpreter start-up)"
          % (args.messages, args.workers))
    for backend in ("dir", "log"):
        rate, per = inject(backend, args.messages, args.workers)
        print("  %-4s %8.0f msg/s   %.2f fsyncs/msg" % (backend, rate, per))


# --- qmail-send's side: preprocess, deliver, complete ------------------------------

def _route(addr):
    return ("local" if addr.endswith(b"@bench.example") else "remote"), addr


def _work_through(backend, ns):
    """qmail-send's backend calls for messages with one recipient each, all delivered."""
    for n in ns:
        p = backend.preprocess(n, _route)
        for channel in p.channels:
            backend.info(n)
            for rec in backend.recipients(n, channel):
                backend.mark_done(n, channel, rec)
            backend.finish_channel(n, channel)
        backend.complete(n)


def send_side(backend_name, messages):
    base, home = make_home()
    clean = None
    try:
        inject(backend_name, messages, 4, home=home)
        real_fsync, count = os.fsync, [0]

        def counting_fsync(fd):
            count[0] += 1
            return real_fsync(fd)
        if backend_name == "dir":
            from qmailpy.backends.dir.queue import DirQueue
            from qmailpy.send.clean import CleanClient
            clean = subprocess.Popen([os.path.join(BIN, "qmail-clean")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=dict(os.environ, QMAILHOME=home))
            backend = DirQueue(home, cleaner=CleanClient(clean.stdin.fileno(), clean.stdout.fileno()))
        else:
            from qmailpy.backends.log.queue import LogQueue
            backend = LogQueue(home)
            backend.startup()
        ns = backend.new_work()
        os.fsync = counting_fsync
        t = time.perf_counter()
        try:
            _work_through(backend, ns)
            if backend_name == "log":
                backend.checkpoint(force=True)       # FINISHed bodies go here
        finally:
            os.fsync = real_fsync
        if clean is not None:                        # let qmail-clean finish the last async foop
            clean.stdin.close()
            clean.wait()
            clean = None
        elapsed = time.perf_counter() - t
        left = sum(len(os.listdir(os.path.join(home, "queue", "mess", str(s)))) for s in range(23))
        assert left == 0, left
        return len(ns) / elapsed, count[0] / len(ns)
    finally:
        if clean is not None:
            clean.stdin.close()
            clean.wait()
        shutil.rmtree(base, ignore_errors=True)


def bench_send(args):
    print("qmail-send side: preprocess + deliver (1 recipient) + complete, %d messages" % args.messages)
    for backend in ("dir", "log"):
        rate, per = send_side(backend, args.messages)
        print("  %-4s %8.0f msg/s   %.2f fsyncs/msg" % (backend, rate, per))


# --- a big deferred log ---------------------------------------------------------

def build_log(home, count, far=10**9):
    """`count` deferred messages (one live REPLACEMENT each), then a checkpoint."""
    from qmailpy.backends.log import records as R
    from qmailpy.backends.log.commit import LogWriter
    writer = LogWriter(os.path.join(home, "queue", "log"))
    now = int(time.time())
    batch = []
    for i in range(count):
        n = 1000000 + i
        batch.append(R.encode_snapshot(R.REPLACEMENT, now, n, R.NOWHERE, now - 3600, 4242, 1000, 2100,
                                       b"sender%d@bench.example" % i, b"", ("remote",),
                                       {"remote": (now + far, [(False, b"rcpt%d@far.example" % i)])}))
        if len(batch) == 2000:
            writer.append(b"".join(batch))
            batch = []
    if batch:
        writer.append(b"".join(batch))
    writer.sync_all()
    writer.close()


MEMORY_CHILD = r"""
import os, sys, time, psutil
sys.path.insert(0, sys.argv[2])
from qmailpy.backends.log.queue import LogQueue
home = sys.argv[1]
lq = LogQueue(home)
t = time.perf_counter()
lq.startup()
now = int(time.time())
walked = 0
while True:                              # every runner walks until it has seen all it may see
    lq.due(now + 10**8)
    if all(r.wake != now + 10**8 for r in lq.state.runners):
        break
rss = psutil.Process().memory_info().rss
print(rss, time.perf_counter() - t, len(lq.state.active))
"""


def bench_memory(args):
    print("qmail-send-side memory: recover, then every queue runner walks the whole log")
    for size in args.sizes:
        base, home = make_home()
        try:
            t = time.perf_counter()
            build_log(home, size)
            built = time.perf_counter() - t
            out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, home, ROOT], check=True,
                                 capture_output=True).stdout.split()
            rss, walk, active = int(out[0]), float(out[1]), int(out[2])
            print("  %8d deferred: RSS %6.1f MB  (walk %.1f s, %d in memory; log built in %.1f s)"
                  % (size, rss / 1e6, walk, active, built))
        finally:
            shutil.rmtree(base, ignore_errors=True)


# --- restart after SIGKILL ------------------------------------------------------

WORK_CHILD = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
from qmailpy.backends.log.queue import LogQueue
from qmailpy.backends.log.enqueue import enqueue
home = sys.argv[1]
lq = LogQueue(home)
lq.startup()
queue = os.path.join(home, "queue")
for i in range(50):
    enqueue(queue, b"x\n", b"s@x", [b"a@far.example", b"b@far.example"])
for n in lq.new_work():
    lq.preprocess(n, lambda a: ("remote", a))
for n in list(lq.state.active)[:20]:
    recs = lq.recipients(n, "remote")
    lq.mark_done(n, "remote", recs[0])
lq.checkpoint(force=True)
for n in list(lq.state.active)[20:40]:
    lq.recipients(n, "remote")
print("ready", flush=True)
sys.stdin.read()
"""

RECOVER_CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
t = time.perf_counter()
from qmailpy.backends.log.queue import LogQueue
lq = LogQueue(sys.argv[1])
lq.recover()
t1 = time.perf_counter()
lq.due()
t2 = time.perf_counter()
print(t1 - t, t2 - t)
"""

DIR_CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
t = time.perf_counter()
from qmailpy.backends.dir.queue import DirQueue
dq = DirQueue(sys.argv[1])
due = dq.startup()
print(time.perf_counter() - t, len(due) + len(dq.schedule))
"""


def _drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def build_dir(home, count):
    queue = os.path.join(home, "queue")
    now = time.time()
    for i in range(count):
        n = 1000000 + i
        s = n % 23
        for kind, data in (("info", b"Fs@x\0"), ("remote", b"Trcpt@far.example\0")):
            path = "%s/%s/%d/%d" % (queue, kind, s, n)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, data)
            os.close(fd)
            if kind == "remote":
                os.utime(path, (now + 10**6, now + 10**6))


def bench_restart(args):
    print("restart after SIGKILL (fresh process; page cache %s)"
          % ("dropped before each run" if os.geteuid() == 0 else "warm"))
    for size in args.sizes:
        base, home = make_home()
        try:
            build_log(home, size)
            child = subprocess.Popen([sys.executable, "-c", WORK_CHILD, home, ROOT],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert child.stdout.readline().strip() == b"ready"
            child.send_signal(signal.SIGKILL)
            child.wait()
            _drop_caches()
            out = subprocess.run([sys.executable, "-c", RECOVER_CHILD, home, ROOT], check=True,
                                 capture_output=True).stdout.split()
            print("  log %8d queued: recovery %.3f s (incl. interpreter imports), first runner step done at %.3f s"
                  % (size, float(out[0]), float(out[1])))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    for size in [s for s in args.sizes if s <= args.dir_max]:
        base, home = make_home()
        try:
            build_dir(home, size)
            _drop_caches()
            out = subprocess.run([sys.executable, "-c", DIR_CHILD, home, ROOT], check=True,
                                 capture_output=True).stdout.split()
            print("  dir %8d queued: startup scan %.3f s (%s entries scheduled)" % (size, float(out[0]),
                                                                                 out[1].decode()))
        finally:
            shutil.rmtree(base, ignore_errors=True)


# --- CRC-32C ----------------------------------------------------------------------

def bench_crc(args):
    from qmailpy.backends.log import records as R
    data = os.urandom(150)
    for name, fn in (("crc32c package", R._crc32c_native), ("pure Python", R.crc32c_python)):
        if fn is None:
            continue
        k = 20000 if fn is R._crc32c_native else 2000
        t = time.perf_counter()
        for _ in range(k):
            fn(data)
        per = (time.perf_counter() - t) / k
        print("  %-15s %8.2f us per 150-byte record (%.0f MB/s)" % (name, per * 1e6, 150 / per / 1e6))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", nargs="?", default="all", choices=("inject", "send", "memory", "restart", "crc", "all"))
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--dir-max", type=int, default=100000, help="largest directory queue to build")
    args = p.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",")]
    if args.what in ("crc", "all"):
        print("CRC-32C:")
        bench_crc(args)
    if args.what in ("inject", "all"):
        bench_inject(args)
    if args.what in ("send", "all"):
        bench_send(args)
    if args.what in ("memory", "all"):
        bench_memory(args)
    if args.what in ("restart", "all"):
        bench_restart(args)


if __name__ == "__main__":
    main()
