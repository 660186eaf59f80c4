"""Local deliveries per second through qmail-lspawn into a Maildir.

    .venv/bin/python bench/lspawn.py [-n 2000] [-c 10] [--size 2000] [--mbox]

Makes a temporary single-user home (the invoking user, or nobody as root) with
one user in users/assign, writes -n message files into queue/mess, starts
qmail-lspawn, keeps -c deliveries in flight (qmail-send's concurrencylocal)
until all are done, and prints deliveries/s and reply latency. Every delivery
is a fork of qmail-lspawn (no exec) running qmail-local's code: lookup,
privilege drop, tmp/ write, fsync, link to new/, fsync of new/.
"""
import argparse
import os
import pwd
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from qmailpy import spawn  # noqa: E402

BIN = os.path.dirname(sys.executable)


def chown(path, pw):
    if os.geteuid() == 0:
        os.chown(path, pw.pw_uid, pw.pw_gid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2000, help="deliveries (default 2000)")
    ap.add_argument("-c", type=int, default=10, help="deliveries in flight (default 10)")
    ap.add_argument("--size", type=int, default=2000, help="message size in bytes (default 2000)")
    ap.add_argument("--mbox", action="store_true", help="deliver to ./Mailbox instead of ./Maildir/")
    args = ap.parse_args()
    if not 1 <= args.c <= spawn.SLOTS:
        ap.error("-c must be 1..%d" % spawn.SLOTS)

    pw = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    env = dict(os.environ, QMAILHOME=home, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    try:
        subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me",
                        "bench.example", "--user", pw.pw_name], env=env, check=True,
                       capture_output=True)
        user_home = os.path.join(base, "alice")
        for path in (user_home, os.path.join(user_home, "Maildir"),
                     *(os.path.join(user_home, "Maildir", s) for s in ("tmp", "new", "cur"))):
            os.mkdir(path, 0o755 if path == user_home else 0o700)
            chown(path, pw)
        with open(os.path.join(home, "users", "assign"), "w") as f:
            f.write("=alice:%s:%d:%d:%s:::\n.\n" % (pw.pw_name, pw.pw_uid, pw.pw_gid, user_home))

        body = b"x" * 76 + b"\n"
        message = b"From: bench@example.org\nSubject: bench\n\n"
        message += body * max(1, (args.size - len(message)) // len(body))
        messids = []
        for i in range(args.n):
            n = 100000 + i
            rel = "%d/%d" % (n % 23, n)
            path = os.path.join(home, "queue", "mess", rel)
            with open(path, "wb") as f:
                f.write(message)
            chown(path, pw)
            messids.append(rel.encode())

        dd = "./Mailbox" if args.mbox else "./Maildir/"
        proc = subprocess.Popen([os.path.join(BIN, "qmail-lspawn"), dd], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out = proc.stdout.fileno()
        assert os.read(out, 1) == bytes((spawn.SLOTS,))
        reader = spawn.ReplyReader()
        free = list(range(args.c))
        started = {}
        latencies = []
        failures = []
        todo = list(messids)
        t0 = time.monotonic()
        while todo or started:
            while todo and free:
                slot = free.pop()
                proc.stdin.write(spawn.encode_command(slot, todo.pop(), b"bench@example.org",
                                                      b"alice@bench.example"))
                started[slot] = time.monotonic()
            proc.stdin.flush()
            select.select([out], [], [])
            for slot, letter, text in reader.feed(os.read(out, 65536)):
                latencies.append(time.monotonic() - started.pop(slot))
                free.append(slot)
                if letter != b"K":
                    failures.append(letter + text)
        elapsed = time.monotonic() - t0
        with open("/proc/%d/stat" % proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        parent_cpu = (int(fields[11]) + int(fields[12])) / tick
        children_cpu = (int(fields[13]) + int(fields[14])) / tick
        proc.stdin.close()
        proc.wait()
        if failures:
            raise SystemExit("%d deliveries failed, first: %r" % (len(failures), failures[0]))
        if not args.mbox:
            assert len(os.listdir(os.path.join(user_home, "Maildir", "new"))) == args.n
        latencies.sort()
        print("qmail-lspawn -> %s: %d deliveries of %d bytes, %d in flight"
              % (dd, args.n, len(message), args.c))
        print("  %.0f deliveries/s (%.2f s)" % (args.n / elapsed, elapsed))
        print("  reply latency: median %.1f ms, p95 %.1f ms, max %.1f ms" % (
            statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.95)] * 1000,
            latencies[-1] * 1000))
        print("  CPU per delivery (user+sys): qmail-lspawn %.2f ms, delivery children %.2f ms"
              % (parent_cpu * 1000 / args.n, children_cpu * 1000 / args.n))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
