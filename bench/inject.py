#!/usr/bin/env python3
"""Queue N messages (argv[1], default 2000) through qmail-queue, one process each.

Prints messages/s, the median wall time per message, the median wall time of a
bare `python3 -I -S -c pass` measured in the same run (same interpreter, same
way of starting it), and the share of our per-message time that is interpreter
start-up. Target: ours <= 2 x bare.

Usage: .venv/bin/python bench/inject.py [N]
"""
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.dirname(os.path.abspath(sys.executable))
MESSAGE = b"From: bench@bench.example\nTo: rcpt@bench.example\nSubject: bench\n\n" + b"x" * 2000 + b"\n"
ENVELOPE = b"Fbench@bench.example\0Trcpt@bench.example\0\0"


def make_home():
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    return base, home


def timed(argv, env, message=None, envelope=None):
    """Wall time of one process, from spawn to reaped; its exit status."""
    msg_r, msg_w = os.pipe()
    env_r, env_w = os.pipe()
    os.write(msg_w, message or b"")           # both fit in a pipe buffer: written before the start
    os.close(msg_w)
    os.write(env_w, envelope or b"")
    os.close(env_w)
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_DUP2, msg_r, 0), (os.POSIX_SPAWN_DUP2, env_r, 1)])
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - start
    os.close(msg_r)
    os.close(env_r)
    return elapsed, os.waitstatus_to_exitcode(status)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    base, home = make_home()
    env = dict(os.environ, QMAILHOME=home, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("QMAILQUEUE", None)
    try:
        bare_argv = [sys.executable, "-I", "-S", "-c", "pass"]
        ours_argv = [os.path.join(BIN, "qmail-queue")]
        bare, ours = [], []
        failures = 0
        wall_start = time.perf_counter()
        # Interleave the two so that both see the same machine load.
        for i in range(n):
            t, code = timed(ours_argv, env, MESSAGE, ENVELOPE)
            ours.append(t)
            failures += code != 0
            if i % 4 == 0:
                bare.append(timed(bare_argv, env)[0])
        total = time.perf_counter() - wall_start - sum(bare)
        queued = len(os.listdir(os.path.join(home, "queue", "todo")))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med_ours, med_bare = statistics.median(ours), statistics.median(bare)
    print("messages queued:            %d of %d (%d failures)" % (queued, n, failures))
    print("messages/s:                 %.1f" % (n / total))
    print("median per message:         %.2f ms" % (med_ours * 1000))
    print("median bare python start:   %.2f ms  (%s -I -S -c pass, %d runs)" % (
        med_bare * 1000, sys.executable, len(bare)))
    print("ours / bare:                %.2f  (target <= 2.00)" % (med_ours / med_bare))
    print("share spent starting Python: %.0f%%" % (100 * min(1.0, med_bare / med_ours)))
    return 0 if failures == 0 and queued == n else 1


if __name__ == "__main__":
    sys.exit(main())
