"""End-to-end local delivery: N messages injected as fast as possible, time until
all are in Maildir/new.

    .venv/bin/python bench/deliver.py [-n 2000] [--injectors 4] [--size 2000] [--backend dir|log|both]
                                      [--via fork|socket]

Builds a throw-away home (`qmailctl init`), one user with ~/Maildir/ in
users/assign, starts the real daemons with `qmail-start ./Maildir/`, and
injects from several long-lived injector processes: with --via fork (the
default) through qmail-queue's code in a forked child (qmailpy.queue.client, as
qmail-inject does with queue rights); with --via socket each injector is a
client of qmail-qmqpd (started here, from QMAILHOME/bin) and sends every
message over its local socket in one QMQP request (ServerSubmission, what a
submitter without queue rights does). Each message carries `X-Bench: i`; arrivals in
Maildir/new are watched with inotify. Prints messages/s (first injection to
last arrival) and the median and 95th percentile injection-to-delivery latency.
Run as root, every daemon runs as `nobody`; otherwise as the invoking user.

--backend picks control/queuebackend (default dir); `both` runs dir then log with
the same N. For each backend a second, identical run under
`strace -f -c --seccomp-bpf -e trace=fsync,fdatasync` (injectors and daemons alike)
counts fsyncs per delivered message; its own time is not reported, because
tracing slows it (--no-strace skips it, or it is skipped when strace is missing).

Each run also prints where the CPU went, in ms per message: the injectors with
their forked qmail-queue children (or qmail-qmqpd with its children), qmail-send, qmail-lspawn itself, its delivery
children (the Maildir deliveries: the same code on both backends), and
qmail-clean. The delivery children's share bounds how much faster one backend
can make the whole run; the summary prints that bound next to the ratio.
"""
import argparse
import multiprocessing
import os
import pwd
import shutil
import resource
import signal
import subprocess
import sys
import tempfile
import time

import psutil
from inotify_simple import INotify, flags


def make_home(base, user, backend="dir"):
    """A home by `qmailctl init` with user `bench` (~/Maildir/) in users/assign; (home,
    maildir, env), env's PATH starting with HOME/bin (the launchers init wrote)."""
    home = os.path.join(base, "home")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    subprocess.run(["qmailctl", "init", "--home", home, "--me", "bench.example", "--user", user],
                   env=env, check=True, capture_output=True)
    env["PATH"] = os.path.join(home, "bin") + os.pathsep + env["PATH"]
    pw = pwd.getpwnam(user)
    userhome = os.path.join(base, "bench")
    for path in (userhome, userhome + "/Maildir", userhome + "/Maildir/new",
                 userhome + "/Maildir/cur", userhome + "/Maildir/tmp"):
        os.mkdir(path, 0o700)
        if os.geteuid() == 0:
            os.chown(path, pw.pw_uid, pw.pw_gid)
    with open(os.path.join(home, "users", "assign"), "w") as f:
        f.write("=bench:%s:%d:%d:%s:::\n.\n" % (user, pw.pw_uid, pw.pw_gid, userhome))
    if backend != "dir":
        path = os.path.join(home, "control", "queuebackend")
        with open(path, "w") as f:
            f.write(backend + "\n")
        os.chmod(path, 0o644)
    env["QMAILHOME"] = home
    return home, userhome + "/Maildir", env


def inject(args):
    home, first, count, size, out, via = args
    if via == "socket":
        from qmailpy.queue.client import ServerSubmission as client
    else:
        from qmailpy.queue.client import QueueClient as client      # root or the queue's owner: a fork
    body = b"x" * max(0, size - 60) + b"\n"
    times = []
    own0, queueing0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    for i in range(first, first + count):
        msg = b"X-Bench: %d\nSubject: bench\n\n" % i + body
        t = time.time()
        qq = client(home)
        qq.write(msg)
        result = qq.finish(b"sender@bench.example", [b"bench@bench.example"])
        if not result.ok:
            raise SystemExit("qmail-queue failed: %r" % result)
        times.append((i, t))
    own = _cpu(resource.RUSAGE_SELF) - own0
    queueing = _cpu(resource.RUSAGE_CHILDREN) - queueing0      # the reaped qmail-queue forks
    with open(out, "w") as f:
        f.write("cpu %.6f %.6f\n" % (own, queueing))
        f.write("".join("%d %.6f\n" % it for it in times))


CPU_ORDER = ("injectors", "qmail-queue children", "qmail-qmqpd", "qmail-send", "qmail-lspawn", "delivery children",
             "qmail-clean", "qmail-rspawn")


def _cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def program_name(argv, default):
    """qmail-send from [python, .../qmail-send] (pip's script) or [python, -IS, .../qmail-send]."""
    return next((os.path.basename(a) for a in argv[1:3] if "qmail-" in a), default)


def daemon_cpu(start_pid):
    """CPU seconds so far of qmail-send (qmail-start's process) and the daemons it
    started, by program; "delivery children" are qmail-lspawn's delivery workers, live
    and reaped (and the programs they ran)."""
    send = psutil.Process(start_pid)
    by_name = {}
    for proc in [send] + send.children():
        try:
            argv = proc.cmdline()
            times = proc.cpu_times()
        except psutil.Error:
            continue
        name = program_name(argv, proc.name())
        by_name[name] = by_name.get(name, 0) + times.user + times.system
        if name == "qmail-lspawn":
            workers = times.children_user + times.children_system
            for worker in proc.children():
                try:
                    t = worker.cpu_times()
                except psutil.Error:
                    continue
                workers += t.user + t.system + t.children_user + t.children_system
            by_name["delivery children"] = workers
    return by_name


def tree_cpu(pid):
    """CPU seconds of a process with its live children and those it has reaped."""
    proc = psutil.Process(pid)
    times = proc.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def start_send(env, logpath):
    """qmail-start ./Maildir/ from env's PATH, once qmail-send logged its status."""
    log = open(logpath, "wb")
    proc = subprocess.Popen(["qmail-start", "./Maildir/"], stdout=log, stderr=log, env=env,
                            cwd="/", start_new_session=True)
    deadline = time.time() + 30
    while b"status:" not in open(logpath, "rb").read():
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit("qmail-send did not start")
        time.sleep(0.01)
    return proc


def start_qmqpd(env, logpath):
    """qmail-qmqpd from env's PATH (QMAILHOME/bin), once it says it listens."""
    log = open(logpath, "wb")
    proc = subprocess.Popen(["qmail-qmqpd"], stdout=log, stderr=log, env=env, cwd="/",
                            start_new_session=True)
    deadline = time.time() + 30
    while b"listening on" not in open(logpath, "rb").read():
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit("qmail-qmqpd did not start: %s" % open(logpath, "rb").read()[-2000:])
        time.sleep(0.01)
    return proc


def count_fsyncs(args, backend):
    """fsync + fdatasync calls of one whole run (every process) under strace."""
    out = tempfile.mktemp(prefix="qmailpy-bench-strace-")
    argv = ["strace", "-f", "-c", "--seccomp-bpf", "-e", "trace=fsync,fdatasync", "-o", out,
            sys.executable, os.path.abspath(__file__), "-n", str(args.n), "--injectors", str(args.injectors),
            "--size", str(args.size), "--backend", backend, "--via", args.via, "--no-strace"] + (["--prefill"] if args.prefill else [])
    done = subprocess.run(argv, capture_output=True)
    if done.returncode != 0:
        raise SystemExit("traced run failed: %s" % done.stderr.decode(errors="replace")[-2000:])
    calls = 0
    with open(out) as f:
        for line in f:
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync"):
                calls += int(parts[3])
    os.unlink(out)
    return calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="messages (default 2000)")
    parser.add_argument("--injectors", type=int, default=4, help="parallel injectors (default 4)")
    parser.add_argument("--size", type=int, default=2000, help="message size in bytes (default 2000)")
    parser.add_argument("--prefill", action="store_true",
                        help="queue everything first, then start the daemons: delivery speed alone")
    parser.add_argument("--backend", choices=("dir", "log", "both"), default="dir",
                        help="queue backend (both: dir then log, same N)")
    parser.add_argument("--via", choices=("fork", "socket"), default="fork",
                        help="forked qmail-queue code (default) or qmail-qmqpd's local socket")
    parser.add_argument("--no-strace", action="store_true", help="do not count fsyncs")
    args = parser.parse_args()
    backends = ("dir", "log") if args.backend == "both" else (args.backend,)
    figures = {}
    for backend in backends:
        print("== backend %s" % backend, flush=True)
        code, rate, cpu = run(args, backend)
        if code:
            return code
        fsyncs = None
        if not args.no_strace and shutil.which("strace"):
            fsyncs = count_fsyncs(args, backend) / args.n
            print("fsyncs per delivered message: %.2f (fsync+fdatasync, all processes)" % fsyncs, flush=True)
        figures[backend] = (rate, fsyncs, cpu)
    if len(figures) == 2:
        print("== summary (N=%d)" % args.n)
        for backend, (rate, fsyncs, cpu) in figures.items():
            print("%-4s %8.1f messages/s end to end   fsyncs/message %s   CPU ms/message %.2f" % (
                backend, rate, "-" if fsyncs is None else "%.2f" % fsyncs, sum(cpu.values()) * 1000 / args.n))
        print("log / dir: %.2fx" % (figures["log"][0] / figures["dir"][0]))
        dir_cpu = figures["dir"][2]
        shared = dir_cpu.get("delivery children", 0) / sum(dir_cpu.values())
        if shared:
            print("delivery children: %.0f%% of the directory backend's CPU; a backend whose own work"
                  " cost nothing would be at most %.2fx faster when CPU-bound" % (shared * 100, 1 / shared))
    return 0


def run(args, backend):
    """One run on a fresh home: (exit code, end-to-end messages/s)."""
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    send = qmqpd = None
    try:
        home, maildir, env = make_home(base, user, backend)
        if args.via == "socket":
            qmqpd = start_qmqpd(env, os.path.join(base, "qmqpd.log"))
        def start_daemons():
            return start_send(env, os.path.join(base, "send.log"))
        if not args.prefill:
            send = start_daemons()
        new = os.path.join(maildir, "new")
        ino = INotify()
        ino.add_watch(new, flags.CREATE | flags.MOVED_TO)
        per = [args.n // args.injectors + (1 if k < args.n % args.injectors else 0)
               for k in range(args.injectors)]
        jobs, first = [], 0
        for k, count in enumerate(per):
            jobs.append((home, first, count, args.size, os.path.join(base, "inject.%d" % k), args.via))
            first += count
        os.environ["QMAILHOME"] = home
        arrivals = {}
        start = time.time()
        pool = multiprocessing.Pool(args.injectors)
        pending = pool.map_async(inject, jobs)
        if args.prefill:
            pending.get(timeout=600)
            injected_at = time.time()
            print("injection alone: %.1f messages/s" % (args.n / (injected_at - start)))
            start = time.time()
            send = start_daemons()
        deadline = time.time() + max(120, args.n / 5)
        while len(arrivals) < args.n and time.time() < deadline:
            for event in ino.read(timeout=1000):
                arrivals.setdefault(event.name, time.time())
        pending.get(timeout=60)
        pool.close()
        cpu = daemon_cpu(send.pid)
        if qmqpd is not None:
            cpu["qmail-qmqpd"] = tree_cpu(qmqpd.pid)
        cpu["injectors"] = cpu["qmail-queue children"] = 0.0
        injected = {}
        for job in jobs:
            with open(job[4]) as f:
                for line in f:
                    first, *rest = line.split()
                    if first == "cpu":
                        cpu["injectors"] += float(rest[0])
                        cpu["qmail-queue children"] += float(rest[1])
                    else:
                        injected[int(first)] = float(rest[0])
        latencies = []
        for name, t in arrivals.items():
            with open(os.path.join(new, name), "rb") as f:
                head = f.read(4096)
            i = int(head.split(b"X-Bench: ", 1)[1].split(b"\n", 1)[0])
            latencies.append(t - (start if args.prefill else injected[i]))
        end = max(arrivals.values()) if arrivals else time.time()
        latencies.sort()
        print("messages: %d injected, %d delivered to Maildir/new" % (len(injected), len(arrivals)))
        print("injectors: %d (%s), size: %d bytes, user: %s" % (
            args.injectors, "qmail-qmqpd's socket" if args.via == "socket" else "forked qmail-queue",
            args.size, user))
        rate = len(arrivals) / (end - start)
        print("throughput: %.1f messages/s end to end (%.2f s)" % (rate, end - start))
        if latencies:
            print("latency injection->Maildir/new: median %.1f ms, p95 %.1f ms" % (
                latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.95)] * 1000))
        print("CPU ms per message: %s; total %.2f" % (", ".join(
            "%s %.2f" % (name, cpu[name] * 1000 / args.n) for name in CPU_ORDER if name in cpu),
            sum(cpu.values()) * 1000 / args.n))
        sys.stdout.flush()
        return (0 if len(arrivals) == args.n else 1), rate, cpu
    finally:
        for proc in (send, qmqpd):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
