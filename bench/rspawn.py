"""Remote deliveries per second through qmail-rspawn to a local aiosmtpd.

    .venv/bin/python bench/rspawn.py [-n 1000] [-c 20] [--size 2000] [--exec]

Makes a temporary single-user home routed by control/smtproutes to an
aiosmtpd Sink (a separate process) on 127.0.0.1, starts qmail-rspawn, keeps
-c deliveries in flight (qmail-send's concurrencyremote) until -n are done, and
prints deliveries/s and reply latency. --exec sets $QMAILREMOTE to the
qmail-remote program, so every delivery starts an interpreter, for comparison.
"""
import argparse
import os
import pwd
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from qmailpy import spawn  # noqa: E402

BIN = os.path.dirname(sys.executable)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=1000, help="deliveries (default 1000)")
    ap.add_argument("-c", type=int, default=20, help="deliveries in flight (default 20)")
    ap.add_argument("--size", type=int, default=2000, help="message size in bytes (default 2000)")
    ap.add_argument("--exec", action="store_true", help="exec qmail-remote per delivery ($QMAILREMOTE)")
    args = ap.parse_args()

    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    env = dict(os.environ, QMAILHOME=home, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("QMAILREMOTE", None)
    if args.exec:
        env["QMAILREMOTE"] = os.path.join(BIN, "qmail-remote")
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], env=env, check=True, capture_output=True)
    port = free_port()
    with open(os.path.join(home, "control", "smtproutes"), "w") as f:
        f.write("bench.test:[127.0.0.1]:%d\n" % port)
    line = b"x" * 70 + b"\n"
    body = b"Subject: bench\n\n" + line * max(1, args.size // len(line))
    mess = os.path.join(home, "queue", "mess", "1", "24")
    with open(mess, "wb") as f:
        f.write(body)
    pw = pwd.getpwnam(user)
    if os.geteuid() == 0:
        os.chown(mess, pw.pw_uid, pw.pw_gid)

    smtpd = subprocess.Popen([os.path.join(BIN, "aiosmtpd"), "-n", "-l", "127.0.0.1:%d" % port,
                              "-c", "aiosmtpd.handlers.Sink"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rspawn = None
    try:
        wait_listening(port)
        rspawn = subprocess.Popen([os.path.join(BIN, "qmail-rspawn")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env)
        out = rspawn.stdout.fileno()
        assert os.read(out, 1) == bytes([120])
        reader = spawn.ReplyReader()
        free = list(range(min(args.c, 120)))
        started = {}
        latencies = []
        letters = {}
        sent = done = 0
        t0 = time.monotonic()
        while done < args.n:
            while free and sent < args.n:
                slot = free.pop()
                rspawn.stdin.write(spawn.encode_command(slot, b"1/24", b"bench@bench.example",
                                                        b"u%d@bench.test" % sent))
                started[slot] = time.monotonic()
                sent += 1
            rspawn.stdin.flush()
            select.select([out], [], [])
            for slot, letter, text in reader.feed(os.read(out, 65536)):
                latencies.append(time.monotonic() - started.pop(slot))
                letters[letter] = letters.get(letter, 0) + 1
                if letter != b"K" and letters[letter] == 1:
                    print("first %s reply: %r" % (letter.decode(), text), file=sys.stderr)
                free.append(slot)
                done += 1
        elapsed = time.monotonic() - t0
        rspawn.stdin.close()
        rspawn.wait(60)
    finally:
        if rspawn and rspawn.poll() is None:
            rspawn.kill()
        smtpd.terminate()
        smtpd.wait(30)
        shutil.rmtree(base, ignore_errors=True)

    mode = "exec qmail-remote per delivery" if args.exec else "fork, no exec"
    print("qmail-rspawn (%s): %d deliveries of %d bytes, %d in flight" % (mode, args.n, len(body), args.c))
    print("  results: %s" % ", ".join("%s %d" % (k.decode(), v) for k, v in sorted(letters.items())))
    print("  %.1f deliveries/s (%.2f s)" % (args.n / elapsed, elapsed))
    print("  reply latency: median %.1f ms, p95 %.1f ms" % (
        statistics.median(latencies) * 1000, sorted(latencies)[int(len(latencies) * 0.95)] * 1000))


if __name__ == "__main__":
    main()
