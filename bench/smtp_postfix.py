"""SMTP in -> Maildir, qmailpy and Postfix side by side, alternating rounds in one run.

    .venv/bin/python bench/smtp_postfix.py [-n 2000] [-s 10] [-l 2000] [--rounds 2]
                                           [--backend dir|log|both] [--fsyncs]

Root only. Installs Postfix from Debian if missing (bench/sendmail_postfix.py's
install_postfix) and adds the account qpbench (removed at the end) whose Maildir
receives Postfix's copies. Each round runs Postfix's own load generator against
each system in turn:

    smtp-source -s SESSIONS -m N -l SIZE -f sender@bench.example -t RCPT 127.0.0.1:PORT

(a new connection per message), and times the first connect until the N-th file
appears in the recipient's Maildir/new (inotify).

qmailpy: a home made by `qmailctl init` (bench/deliver.py's make_home, every role
`nobody`, user `bench` with ~/Maildir/), qmail-qmqpd, qmail-start ./Maildir/ and
qmail-smtpd-listen on 127.0.0.1:2525 (log backend: 2526), all from QMAILHOME/bin, as `qmailctl start
--smtp` runs them. Postfix: main.cf for local delivery to Maildir/ on loopback
(sendmail_postfix.POSTFIX_SETTINGS), its smtpd on 127.0.0.1:25.

CPU ms per message is by program over each system's whole process tree (live
processes and what their parents reaped), smtp-source excluded, and split into user
time (the programs' own work: for qmailpy the interpreter's) and system time (the
kernel's: TCP, files, fsyncs). With --fsyncs a
last, separate round per system runs with the daemons traced (strace -f -c -p on
every daemon, no --seccomp-bpf since it attaches) and reports fsync+fdatasync
calls per message; tracing slows that round, so its time is not reported.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
from inotify_simple import INotify, flags

from deliver import make_home, start_qmqpd, start_send
from sendmail_postfix import (ACCOUNT, DOMAIN, POSTFIX_SETTINGS, add_account, bench_dir,
                              cpu_kinds, cpu_per_message, cpu_snapshot, install_postfix,
                              postfix_version, print_summary, report_round, run_command, spread)

QMAILPY_PORTS = {"dir": 2525, "log": 2526}
POSTFIX_PORT = 25


def start_listener(env, logpath, port):
    """qmail-smtpd-listen from env's PATH, once it says it listens."""
    log = open(logpath, "wb")
    proc = subprocess.Popen(["qmail-smtpd-listen", "127.0.0.1:%d" % port], stdout=log, stderr=log,
                            env=env, cwd="/", start_new_session=True)
    deadline = time.time() + 30
    while b"listening on" not in open(logpath, "rb").read():
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit("qmail-smtpd-listen did not start: %s" % open(logpath, "rb").read()[-2000:])
        time.sleep(0.01)
    return proc


class Qmailpy:
    def __init__(self, base, backend):
        self.name = "qmailpy (%s)" % backend
        self.dir = os.path.join(base, "qmailpy-" + backend)
        os.mkdir(self.dir)
        os.chmod(self.dir, 0o755)
        spread(self.dir)            # the queue home and the Maildir apart (bench_dir)
        self.home, self.maildir, env = make_home(self.dir, "nobody", backend)
        self.rcpt = "bench@" + DOMAIN
        self.port = QMAILPY_PORTS[backend]
        self.procs = []
        try:
            self.procs.append(start_qmqpd(env, os.path.join(self.dir, "qmqpd.log")))
            self.procs.append(start_send(env, os.path.join(self.dir, "send.log")))
            self.procs.append(start_listener(env, os.path.join(self.dir, "smtpd.log"), self.port))
        except BaseException:
            self.stop()
            raise

    def pids(self):
        return [p.pid for p in self.procs]

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


class Postfix:
    def __init__(self, maildir):
        self.name = "Postfix %s" % postfix_version()
        self.maildir = maildir
        self.rcpt = "%s@%s" % (ACCOUNT, DOMAIN)
        self.port = POSTFIX_PORT
        run_command(["postconf", "-e"] + ["%s=%s" % kv for kv in POSTFIX_SETTINGS.items()])
        run_command(["newaliases"])
        subprocess.run(["postfix", "stop"], capture_output=True)
        run_command(["postfix", "start"])
        with open("/var/spool/postfix/pid/master.pid") as f:
            self.master = int(f.read().split()[0])
        deadline = time.time() + 30
        while not any(p.name() == "qmgr" for p in psutil.Process(self.master).children()):
            if time.time() > deadline:
                raise SystemExit("postfix did not start its queue manager")
            time.sleep(0.05)

    def pids(self):
        return [self.master]

    def stop(self):
        subprocess.run(["postfix", "stop"], capture_output=True)


def one_round(system, args, trace=False):
    """Send N messages with smtp-source; (messages/s, {program: CPU ms/message}, fsyncs/message)."""
    # Earlier rounds' files stay until the end: deleting them here would make this round's
    # new files look past them for a free inode (bench_dir).
    new = os.path.join(system.maildir, "new")
    ino = INotify()
    ino.add_watch(new, flags.CREATE | flags.MOVED_TO)
    tracer = out = None
    if trace:
        out = tempfile.mktemp(prefix="qmailpy-bench-strace-")
        argv = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out]
        for pid in system.pids():
            argv += ["-p", str(pid)]
        tracer = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
        time.sleep(1.0)             # strace attaches to every thread before the load starts
    before = cpu_snapshot(system.pids())
    kinds_before = cpu_kinds(system.pids())
    start = time.time()
    source = subprocess.Popen(["smtp-source", "-s", str(args.s), "-m", str(args.n), "-l", str(args.l),
                               "-f", "sender@" + DOMAIN, "-t", system.rcpt,
                               "127.0.0.1:%d" % system.port], stderr=subprocess.PIPE)
    arrived = 0
    last = start
    deadline = start + max(300, args.n / 2)
    while arrived < args.n and time.time() < deadline:
        events = ino.read(timeout=1000)
        if events:
            arrived += len(events)
            last = time.time()
    source_err = source.communicate()[1]
    after = cpu_snapshot(system.pids())
    kinds = {kind: (seconds - kinds_before[kind]) * 1000 / args.n
             for kind, seconds in cpu_kinds(system.pids()).items()}
    fsyncs = None
    if tracer is not None:
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
        fsyncs = 0
        with open(out) as f:
            for line in f:
                parts = line.split()
                if parts and parts[-1] in ("fsync", "fdatasync"):
                    fsyncs += int(parts[3])
        os.unlink(out)
    if arrived < args.n or source.returncode != 0:
        raise SystemExit("%s: %d of %d arrived; smtp-source exit %d: %s" % (
            system.name, arrived, args.n, source.returncode, source_err.decode(errors="replace")[-1000:]))
    cpu = cpu_per_message(before, after, args.n)
    return args.n / (last - start), cpu, (None if fsyncs is None else fsyncs / args.n), kinds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="messages per round (default 2000)")
    parser.add_argument("-s", type=int, default=10, help="parallel SMTP sessions (default 10)")
    parser.add_argument("-l", type=int, default=2000, help="message size in bytes (default 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per system (default 2)")
    parser.add_argument("--backend", choices=("dir", "log", "both"), default="both")
    parser.add_argument("--fsyncs", action="store_true", help="a traced round per system counts fsyncs")
    parser.add_argument("--no-postfix", action="store_true", help="qmailpy only")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/smtp_postfix.py must run as root", file=sys.stderr)
        return 2
    base = bench_dir()
    created = False
    systems = []
    try:
        if not args.no_postfix:
            install_postfix()
            created, maildir = add_account(base)
        backends = ("dir", "log") if args.backend == "both" else (args.backend,)
        print("smtp-source -s %d -m %d -l %d, %d rounds, a new connection per message"
              % (args.s, args.n, args.l, args.rounds))
        results = {}
        for k in range(args.rounds):
            for backend in backends:
                system = Qmailpy(base, backend) if k == 0 else next(
                    s for s in systems if s.name == "qmailpy (%s)" % backend)
                if k == 0:
                    systems.append(system)
                rate, cpu, _, kinds = one_round(system, args)
                report_round("%s r%d" % (system.name, k + 1), rate, cpu, kinds)
                results.setdefault(system.name, []).append(rate)
            if not args.no_postfix:
                postfix = Postfix(maildir)
                try:
                    rate, cpu, _, kinds = one_round(postfix, args)
                    report_round("%s r%d" % (postfix.name, k + 1), rate, cpu, kinds)
                    results.setdefault(postfix.name, []).append(rate)
                finally:
                    postfix.stop()
        if args.fsyncs:
            for system in systems:
                print("%s: %.2f fsyncs per message" % (system.name, one_round(system, args, True)[2]))
            if not args.no_postfix:
                postfix = Postfix(maildir)
                try:
                    print("%s: %.2f fsyncs per message" % (postfix.name, one_round(postfix, args, True)[2]))
                finally:
                    postfix.stop()
        print_summary(results)
    finally:
        for system in systems:
            system.stop()
        if created:
            subprocess.run(["userdel", ACCOUNT], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
