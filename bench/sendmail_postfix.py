"""`sendmail` run by an ordinary user, qmailpy's and Postfix's side by side in one run.

    .venv/bin/python bench/sendmail_postfix.py [-n 2000] [--callers 2] [--size 2000] [--backend dir|log]

Root only: it installs Postfix from Debian if missing (apt-get, non-interactive,
"Local only"), and adds an ordinary account `qpbench` (removed at the end) whose
home is in the run's throw-away directory. For each system, --callers processes
running as qpbench each run `sendmail RECIPIENT` once per message (one process
per message, the message on stdin) until N messages are submitted; the time is
from the first submission to the N-th arrival in the recipient's Maildir/new
(watched with inotify).

qmailpy: a home made by `qmailctl init` (bench/deliver.py's make_home, every role
`nobody`), qmail-qmqpd and qmail-start run from QMAILHOME/bin; qpbench has no queue
rights, so QMAILHOME/bin/sendmail queues through qmail-qmqpd's socket.
Postfix: main.cf set for local delivery only (mydestination bench.example,
home_mailbox Maildir/, loopback only), `postfix start`, /usr/sbin/sendmail
(postdrop, pickup, cleanup, qmgr, local); `postfix stop` afterwards.

CPU per message is by process: the callers' sendmail processes (and what they
ran and reaped: postdrop), and every daemon of each system with the children it
reaped, measured as the difference over the run.
"""
import argparse
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
from inotify_simple import INotify, flags

from deliver import make_home, program_name, start_qmqpd, start_send

ACCOUNT = "qpbench"
DOMAIN = "bench.example"
POSTFIX_SETTINGS = {
    "myhostname": DOMAIN, "mydomain": DOMAIN, "myorigin": DOMAIN,
    "mydestination": DOMAIN + ", localhost", "inet_interfaces": "loopback-only",
    "inet_protocols": "ipv4", "home_mailbox": "Maildir/", "mailbox_command": "",
    "relayhost": "", "mailbox_size_limit": "0", "message_size_limit": "0",
}


def run_command(argv, **kw):
    done = subprocess.run(argv, capture_output=True, **kw)
    if done.returncode != 0:
        raise SystemExit("%s failed (%d): %s" % (" ".join(argv), done.returncode,
                                                 done.stderr.decode(errors="replace")[-2000:]))
    return done


def bench_dir():
    """The run's temporary directory, its subdirectories spread over the file system as
    top-level directories are (chattr +T, ext4's Orlov spreading): the queue home and each
    account's Maildir in block groups of their own, as on a server (/var/qmail,
    /var/spool/postfix, /home). Left in one group, every Maildir file would be made next
    to the queue's deleted files, and ext4 without a journal (as on the machines these
    benchmarks ran on) looks past each inode freed there in the last half minute before
    it takes one: 0.3-0.5 ms per new file instead of 0.03 (measured)."""
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    spread(base)
    return base


def spread(path):
    """Subdirectories made in path from now on are placed as top-level ones (chattr +T);
    a file system without the flag keeps its usual placement."""
    subprocess.run(["chattr", "+T", path], capture_output=True)


def install_postfix():
    if shutil.which("postfix") or os.path.exists("/usr/sbin/postfix"):
        return
    run_command(["debconf-set-selections"], input=(
        b"postfix postfix/main_mailer_type select Local only\n"
        b"postfix postfix/mailname string " + DOMAIN.encode() + b"\n"))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_command(["apt-get", "install", "-y", "-q", "postfix"], env=env, timeout=900)


def add_account(base):
    """qpbench with its home (and ~/Maildir) under base; True if this run created it."""
    home = os.path.join(base, ACCOUNT)
    try:
        pwd.getpwnam(ACCOUNT)
        created = False
    except KeyError:
        run_command(["useradd", "--no-create-home", "--home-dir", home, "--shell", "/usr/sbin/nologin",
                     "--user-group", ACCOUNT])
        created = True
    run_command(["usermod", "--home", home, ACCOUNT])
    pw = pwd.getpwnam(ACCOUNT)
    for path in (home, home + "/Maildir", home + "/Maildir/new", home + "/Maildir/cur",
                 home + "/Maildir/tmp"):
        os.mkdir(path, 0o700)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return created, home + "/Maildir"


def callers(argv, env, n, count, size, base):
    """Run `count` caller processes as qpbench, n messages in all; their pids and result files."""
    pw = pwd.getpwnam(ACCOUNT)
    body = b"x" * max(0, size - 60) + b"\n"
    started = []
    first = 0
    for k in range(count):
        share = n // count + (1 if k < n % count else 0)
        out = os.path.join(base, "caller.%d" % k)
        with open(out, "w"):
            os.chown(out, pw.pw_uid, pw.pw_gid)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgroups([])
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)
                os.chdir(pw.pw_dir)
                code = submit(argv, env, range(first, first + share), body, out)
            finally:
                os._exit(code)
        started.append((pid, out))
        first += share
    return started


def submit(argv, env, numbers, body, out):
    failures = 0
    lines = []
    for i in numbers:
        message = b"To: %s@%s\nSubject: bench\nX-Bench: %d\n\n" % (ACCOUNT.encode(), DOMAIN.encode(), i) + body
        r, w = os.pipe()
        t = time.time()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, r, 0)])
        os.close(r)
        os.write(w, message)            # fits the pipe buffer
        os.close(w)
        _, status = os.waitpid(pid, 0)
        failures += status != 0
        lines.append("%d %.6f\n" % (i, t))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        f.write("cpu %.6f %d\n" % (usage.ru_utime + usage.ru_stime, failures))
        f.write("".join(lines))
    return 0 if failures == 0 else 1


def _processes(pids):
    """(label, cpu_times) of every live process in each pid's tree."""
    procs = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [root] + root.children(recursive=True)
        except psutil.Error:
            continue
    for proc in procs:
        try:
            argv = proc.cmdline()
            times = proc.cpu_times()
        except psutil.Error:
            continue
        yield program_name(argv, os.path.basename(argv[0]) if argv else proc.name()), times


def cpu_snapshot(pids):
    """{process label: CPU seconds} of each pid's tree: every live process by program,
    and what each has reaped as 'LABEL children'."""
    found = {}
    for label, times in _processes(pids):
        found[label] = found.get(label, 0) + times.user + times.system
        reaped = times.children_user + times.children_system
        if reaped:
            found[label + " children"] = found.get(label + " children", 0) + reaped
    return found


def cpu_kinds(pids):
    """{"user": seconds, "system": seconds} over each pid's tree, reaped processes included:
    the interpreter's work against the kernel's."""
    kinds = {"user": 0.0, "system": 0.0}
    for _, times in _processes(pids):
        kinds["user"] += times.user + times.children_user
        kinds["system"] += times.system + times.children_system
    return kinds


def cpu_per_message(before, after, n):
    """{label: CPU ms per message} between two cpu_snapshot()s, for labels that used any."""
    return {label: (seconds - before.get(label, 0)) * 1000 / n
            for label, seconds in after.items() if seconds - before.get(label, 0) > 0}


def report_round(name, rate, cpu, kinds=None):
    """One round's line: its rate and the CPU per message by process, largest first;
    kinds: {"user": ms, "system": ms} per message, shown after the total."""
    split = "" if kinds is None else " (user %.2f, system %.2f)" % (kinds["user"], kinds["system"])
    print("%-22s %8.1f messages/s   CPU ms/message %.2f%s: %s" % (
        name, rate, sum(cpu.values()), split, ", ".join(
            "%s %.2f" % kv for kv in sorted(cpu.items(), key=lambda kv: -kv[1]))))
    sys.stdout.flush()


def print_summary(results):
    """{system name: [rate by round]}: one line each, qmailpy's as a ratio to Postfix's."""
    print("== summary (messages/s by round)")
    reference = next((rates for name, rates in results.items() if name.startswith("Postfix")), None)
    for name, rates in results.items():
        line = "%-22s %s" % (name, "  ".join("%.1f" % r for r in rates))
        if reference and not name.startswith("Postfix"):
            line += "   %.2fx Postfix" % (sum(rates) / sum(reference))
        print(line)


def measure(name, argv, env, daemon_pids, maildir, args, base):
    """Submit and wait for every arrival; print and return (rate, CPU ms by process)."""
    new = os.path.join(maildir, "new")
    ino = INotify()
    ino.add_watch(new, flags.CREATE | flags.MOVED_TO)
    before = cpu_snapshot(daemon_pids)
    start = time.time()
    started = callers(argv, env, args.n, args.callers, args.size, base)
    arrivals = {}
    deadline = time.time() + max(300, args.n / 2)
    while len(arrivals) < args.n and time.time() < deadline:
        for event in ino.read(timeout=1000):
            arrivals.setdefault(event.name, time.time())
    failures = 0
    submitted = {}
    cpu_callers = 0.0
    for pid, out in started:
        os.waitpid(pid, 0)
        with open(out) as f:
            for line in f:
                first, *rest = line.split()
                if first == "cpu":
                    cpu_callers += float(rest[0])
                    failures += int(rest[1])
                else:
                    submitted[int(first)] = float(rest[0])
    after = cpu_snapshot(daemon_pids)
    cpu = {"sendmail (callers' processes)": cpu_callers}
    for label, seconds in after.items():
        if seconds - before.get(label, 0) > 0:
            cpu[label] = seconds - before.get(label, 0)
    latencies = sorted(t - submitted[int(_bench_number(os.path.join(new, fname)))]
                       for fname, t in arrivals.items())
    end = max(arrivals.values()) if arrivals else time.time()
    rate = len(arrivals) / (end - start)
    print("== %s" % name)
    print("messages: %d submitted (%d failed), %d delivered to Maildir/new" % (
        len(submitted), failures, len(arrivals)))
    print("throughput: %.1f messages/s end to end (%.2f s)" % (rate, end - start))
    if latencies:
        print("latency submission->Maildir/new: median %.1f ms, p95 %.1f ms" % (
            latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.95)] * 1000))
    per = {label: seconds * 1000 / args.n for label, seconds in cpu.items()}
    print("CPU ms per message: %s; total %.2f" % (", ".join(
        "%s %.2f" % (label, ms) for label, ms in sorted(per.items(), key=lambda x: -x[1])), sum(per.values())))
    sys.stdout.flush()
    if len(arrivals) != args.n or failures:
        raise SystemExit("%s: not every message arrived" % name)
    return rate, per


def _bench_number(path):
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.split(b"X-Bench: ", 1)[1].split(b"\n", 1)[0]


def run_qmailpy(args, base):
    home, maildir, env = make_home(base, "nobody", args.backend)
    qmqpd = start_qmqpd(env, os.path.join(base, "qmqpd.log"))
    send = start_send(env, os.path.join(base, "send.log"))
    try:
        caller_env = {"PATH": "/usr/bin:/bin", "QMAILHOME": home}
        return measure("qmailpy (%s backend): %s/bin/sendmail" % (args.backend, home),
                       [os.path.join(home, "bin", "sendmail"), "bench@" + DOMAIN], caller_env,
                       [send.pid, qmqpd.pid], maildir, args, base)
    finally:
        for proc in (send, qmqpd):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)


def run_postfix(args, base, maildir):
    install_postfix()
    run_command(["postconf", "-e"] + ["%s=%s" % kv for kv in POSTFIX_SETTINGS.items()])
    run_command(["newaliases"])
    subprocess.run(["postfix", "stop"], capture_output=True)
    run_command(["postfix", "start"])
    try:
        with open("/var/spool/postfix/pid/master.pid") as f:
            master = int(f.read().split()[0])
        deadline = time.time() + 30
        while not any(p.name() == "qmgr" for p in psutil.Process(master).children()):
            if time.time() > deadline:
                raise SystemExit("postfix did not start its queue manager")
            time.sleep(0.05)
        return measure("Postfix %s: /usr/sbin/sendmail" % postfix_version(),
                       ["/usr/sbin/sendmail", "%s@%s" % (ACCOUNT, DOMAIN)], {"PATH": "/usr/bin:/bin"},
                       [master], maildir, args, base)
    finally:
        subprocess.run(["postfix", "stop"], capture_output=True)


def postfix_version():
    done = subprocess.run(["postconf", "-h", "mail_version"], capture_output=True)
    return done.stdout.decode().strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="messages per system (default 2000)")
    parser.add_argument("--callers", type=int, default=2, help="parallel callers (default 2)")
    parser.add_argument("--size", type=int, default=2000, help="message size in bytes (default 2000)")
    parser.add_argument("--backend", choices=("dir", "log"), default="dir", help="qmailpy's queue backend")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/sendmail_postfix.py must run as root (it installs Postfix and adds an account)",
              file=sys.stderr)
        return 2
    base = bench_dir()
    created = False
    try:
        install_postfix()
        created, maildir = add_account(base)
        print("N=%d, %d callers as %s, %d-byte messages" % (args.n, args.callers, ACCOUNT, args.size))
        ours = run_qmailpy(args, base)
        theirs = run_postfix(args, base, maildir)
        print("== summary")
        for name, (rate, per) in (("qmailpy", ours), ("Postfix", theirs)):
            print("%-8s %8.1f messages/s end to end   CPU ms/message %.2f" % (name, rate, sum(per.values())))
        print("qmailpy / Postfix: %.2fx the throughput" % (ours[0] / theirs[0]))
    finally:
        if created:
            subprocess.run(["userdel", ACCOUNT], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
