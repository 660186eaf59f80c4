"""qmail-send's remote delivery rate with and without per-domain rules that never bind.

    .venv/bin/python bench/throttle.py [-n 2000] [--domains 10] [--rounds 2] [--backend dir|log]
                                       [--extra-lines 100] [--binding]

For each round, twice on a fresh home (`qmailctl init`): N one-recipient messages to
u<i>@d<i mod D>.test are queued first (forked qmail-queue code, as bench/deliver.py
--prefill), then the real daemons start (`qmail-start`, qmail-rspawn forking
qmail-remote's code) and deliver them through control/smtproutes to an aiosmtpd Sink
on 127.0.0.1. The time runs from qmail-start to the N-th `end msg` line in
qmail-send's log. The first run of a round has no rules; the second has rules that
apply to every domain and never bind (with --binding, d0.test is held to 1 delivery in
flight and BOUND_RATE a second, so qmail-send throttles it all along, and the rate in both
modes is that of the other domains' messages, until the last of them ended): control/concurrencydomains d<i>.test:120
(concurrencyremote is 20), control/ratelimits d<i>.test:1000000/1,
control/delaydomains d<i>.test:0, plus --extra-lines lines per file for other
domains, so every remote delivery goes through the gate's lookups and counts
(qmailpy/send/throttle.py). The runs alternate so drift hits both alike. Prints
deliveries/s and qmail-send's CPU ms per delivery of each run, their medians per
mode, and the ratio; a `throttling` line in the rules run's log means a rule did
bind and is reported as an error. Last, the gate's own cost per delivery (admit, started,
finished with the rules run's files, in this process, best of 5) in microseconds: the part
of qmail-send's CPU the rules add, without the end-to-end noise of a shared machine.
"""
import argparse
import multiprocessing
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
from inotify_simple import INotify, flags

BIN = os.path.dirname(sys.executable)
BOUND_RATE = 20         # --binding: d0.test's deliveries a second


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_listening(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("aiosmtpd did not start")


def write_control(home, name, text):
    path = os.path.join(home, "control", name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)


def make_home(base, user, backend, port, domains, rules, extra, binding=False):
    home = os.path.join(base, "home")
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("QMAILREMOTE", None)
    subprocess.run(["qmailctl", "init", "--home", home, "--me", "bench.example", "--user", user],
                   env=env, check=True, capture_output=True)
    env["PATH"] = os.path.join(home, "bin") + os.pathsep + env["PATH"]
    env["QMAILHOME"] = home
    names = ["d%d.test" % i for i in range(domains)]
    write_control(home, "smtproutes", "".join("%s:[127.0.0.1]:%d\n" % (d, port) for d in names))
    if backend != "dir":
        write_control(home, "queuebackend", backend + "\n")
    if rules:
        others = ["other%d.example" % i for i in range(extra)]
        free = names[1:] if binding else names
        bound = ("%s:1\n" % names[0], "%s:%d/1\n" % (names[0], BOUND_RATE)) if binding else ("", "")
        write_control(home, "concurrencydomains", bound[0] + "".join("%s:120\n" % d for d in others + free))
        write_control(home, "ratelimits", bound[1] + "".join("%s:1000000/1\n" % d for d in others + free))
        write_control(home, "delaydomains", "".join("%s:0\n" % d for d in others + names))
    return home, env


def inject(args):
    home, first, count, domains = args
    os.environ["QMAILHOME"] = home
    from qmailpy.queue.client import QueueClient
    body = b"Subject: bench\n\n" + b"x" * 70 + b"\n"
    for i in range(first, first + count):
        qq = QueueClient(home)
        qq.write(body)
        result = qq.finish(b"sender@bench.example", [b"u%d@d%d.test" % (i, i % domains)])
        if not result.ok:
            raise SystemExit("qmail-queue failed: %r" % result)


def count_lines(path, prefix):
    with open(path, "rb") as f:
        return sum(1 for line in f if line.startswith(prefix))


def free_domains_done(path, bound):
    """How many messages to a domain other than `bound` have ended (their 'end msg')."""
    bound_msgs, ended = set(), []
    with open(path, "rb") as f:
        for line in f:
            if line.startswith(b"starting delivery ") and line.rstrip(b"\n").endswith(b"@" + bound):
                bound_msgs.add(line.split(b" msg ")[1].split(b" ")[0])
            elif line.startswith(b"end msg "):
                ended.append(line[8:].strip())
    return sum(1 for n in ended if n not in bound_msgs)


def run(args, rules, port):
    """One run on a fresh home: (deliveries/s, qmail-send CPU ms per delivery, throttling lines).
    With --binding the rate is that of the messages to d1..: their count over the time until
    the last of them ended (d0's go on under their limits), in both modes alike."""
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    send = None
    try:
        home, env = make_home(base, user, args.backend, port, args.domains, rules, args.extra_lines,
                              args.binding)
        per = [args.n // 4 + (1 if k < args.n % 4 else 0) for k in range(4)]
        firsts = [sum(per[:k]) for k in range(4)]
        with multiprocessing.Pool(4) as pool:
            pool.map(inject, [(home, f, c, args.domains) for f, c in zip(firsts, per)])
        logpath = os.path.join(base, "send.log")
        open(logpath, "wb").close()
        ino = INotify()
        ino.add_watch(logpath, flags.MODIFY)
        with open(logpath, "ab") as log:
            t0 = time.monotonic()
            send = subprocess.Popen(["qmail-start", "./Maildir/"], stdout=log, stderr=log, env=env,
                                    cwd="/", start_new_session=True)
        deadline = t0 + max(120, args.n / 5)
        free = args.n - len(range(0, args.n, args.domains)) if args.binding else args.n
        freed = None
        while count_lines(logpath, b"end msg ") < args.n:
            if time.monotonic() > deadline or send.poll() is not None:
                raise SystemExit("only %d of %d delivered; log tail:\n%s" % (
                    count_lines(logpath, b"end msg "), args.n, open(logpath, "rb").read()[-2000:].decode()))
            ino.read(timeout=100 if args.binding else 1000)
            if freed is None and args.binding and free_domains_done(logpath, b"d0.test") >= free:
                freed = time.monotonic() - t0
        elapsed = time.monotonic() - t0
        if args.binding:
            elapsed = freed if freed is not None else elapsed
        times = psutil.Process(send.pid).cpu_times()
        cpu = (times.user + times.system) * 1000 / args.n
        with open(logpath, "rb") as f:
            failures = sum(1 for line in f if line.startswith(b"delivery ") and b": success: " not in line)
        if failures:
            raise SystemExit("%d deliveries did not succeed; see the sink" % failures)
        return free / elapsed, cpu, count_lines(logpath, b"throttling ")
    finally:
        if send is not None and send.poll() is None:
            send.send_signal(signal.SIGTERM)
            send.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def gate_cost(domains, extra, n=20000):
    """Microseconds per delivery of Gate.admit + started + finished under the rules run's files."""
    from qmailpy.send.throttle import Gate
    from qmailpy.send.throttlerules import Rules
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    try:
        os.mkdir(os.path.join(base, "control"))
        names = ["d%d.test" % i for i in range(domains)]
        others = ["other%d.example" % i for i in range(extra)]
        write_control(base, "concurrencydomains", "".join("%s:120\n" % d for d in others + names))
        write_control(base, "ratelimits", "".join("%s:1000000/1\n" % d for d in others + names))
        write_control(base, "delaydomains", "".join("%s:0\n" % d for d in others + names))
        gate = Gate(Rules.read(base), lambda line: None)
    finally:
        shutil.rmtree(base)
    addresses = [b"u%d@d%d.test" % (i, i % domains) for i in range(n)]
    now = int(time.time())
    best = None
    for _ in range(5):
        t = time.perf_counter()
        for d, address in enumerate(addresses):
            if gate.admit(address, now, now) is None:
                gate.started(d, address)
                gate.finished(d)
        elapsed = time.perf_counter() - t
        best = elapsed if best is None else min(best, elapsed)
    return best / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2000, help="messages, one recipient each (default 2000)")
    ap.add_argument("--domains", type=int, default=10, help="recipient domains (default 10)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (default 2)")
    ap.add_argument("--backend", choices=("dir", "log"), default="dir")
    ap.add_argument("--extra-lines", type=int, default=100,
                    help="rule lines for other domains in each control file (default 100)")
    ap.add_argument("--binding", action="store_true",
                    help="the rules also hold d0.test to 1 in flight and %d a second; the rate is "
                         "that of the other domains' messages" % BOUND_RATE)
    args = ap.parse_args()
    port = free_port()
    sink = subprocess.Popen([os.path.join(BIN, "aiosmtpd"), "-n", "-l", "127.0.0.1:%d" % port,
                             "-c", "aiosmtpd.handlers.Sink"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = {False: [], True: []}
    try:
        wait_listening(port)
        for r in range(args.rounds):
            for rules in (False, True):
                rate, cpu, throttled = run(args, rules, port)
                if throttled and not args.binding:
                    raise SystemExit("a rule bound: %d throttling lines" % throttled)
                if rules and args.binding and not throttled:
                    raise SystemExit("d0.test's rules never bound")
                results[rules].append((rate, cpu))
                print("round %d %-8s %7.1f deliveries/s  qmail-send CPU %.3f ms/delivery" % (
                    r + 1, "rules" if rules else "no rules", rate, cpu), flush=True)
    finally:
        sink.terminate()
        sink.wait(30)
    print("== %s backend, N=%d, %d domains, %d rounds%s" % (
        args.backend, args.n, args.domains, args.rounds,
        ", d0.test bound (rates of d1..d%d)" % (args.domains - 1) if args.binding else ""))
    med = {}
    for rules in (False, True):
        rates = [x[0] for x in results[rules]]
        cpus = [x[1] for x in results[rules]]
        med[rules] = (statistics.median(rates), statistics.median(cpus))
        print("%-8s median %7.1f deliveries/s  qmail-send CPU %.3f ms/delivery" % (
            "rules" if rules else "no rules", *med[rules]))
    print("rules / no rules: rate %.3f, qmail-send CPU %.3f" % (
        med[True][0] / med[False][0], med[True][1] / med[False][1]))
    print("gate cost per delivery with these rules: %.1f us" % gate_cost(args.domains, args.extra_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
