#!/usr/bin/env python3
"""Queue N messages (default 2000) through QMAILHOME/bin/qmail-queue, one process each.

Each qmail-queue run is followed by a bare `python -I -S -c pass` of the same
interpreter, started the same way (N of each, interleaved, so both see the same
machine load). Prints messages/s, the median wall time per message, the median
bare start, and their ratio. Target: ours <= 1.3 x bare.

Usage: .venv/bin/python bench/inject.py [N] [--fresh-install] [--dir DIR]

The home is made by `qmailctl init`, which writes the launchers in
QMAILHOME/bin. By default that is this tree's .venv (an editable install);
with --fresh-install it is a throw-away, non-editable `pip install` of this
tree (bench/fresh_install.py), as the README installs a server.
"""
import argparse
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from fresh_install import fresh_install

BIN = os.path.dirname(os.path.abspath(sys.executable))
TARGET = 1.3
MESSAGE = b"From: bench@bench.example\nTo: rcpt@bench.example\nSubject: bench\n\n" + b"x" * 2000 + b"\n"
ENVELOPE = b"Fbench@bench.example\0Trcpt@bench.example\0\0"


def make_home(base, bindir=BIN):
    """A home made by BINDIR's qmailctl init (so its bin/ has that installation's launchers)."""
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(bindir, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    return home


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=2000, help="messages (default 2000)")
    parser.add_argument("--fresh-install", action="store_true",
                        help="launchers of a throw-away non-editable pip install of this tree")
    parser.add_argument("--dir", metavar="DIR", default=None,
                        help="where the throw-away home goes (default: the system's temp dir); "
                             "/dev/shm takes fsync's cost out of the figure")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="qmailpy-bench-", dir=args.dir)
    os.chmod(base, 0o755)
    try:
        bindir = os.path.join(fresh_install(base), "bin") if args.fresh_install else BIN
        home = make_home(base, bindir)
        env = dict(os.environ, QMAILHOME=home, PATH=os.path.join(home, "bin") + os.pathsep + "/usr/bin:/bin")
        env.pop("QMAILQUEUE", None)
        ours_argv = [os.path.join(home, "bin", "qmail-queue")]
        with open(ours_argv[0]) as f:
            python = f.readline()[2:].split()[0]          # the launcher's own interpreter
        bare_argv = [python, "-I", "-S", "-c", "pass"]
        bare, ours = [], []
        failures = 0
        wall_start = time.perf_counter()
        for i in range(args.n):
            t, code = timed(ours_argv, env, MESSAGE, ENVELOPE)
            ours.append(t)
            failures += code != 0
            bare.append(timed(bare_argv, env)[0])
        total = time.perf_counter() - wall_start - sum(bare)
        queued = len(os.listdir(os.path.join(home, "queue", "todo")))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med_ours, med_bare = statistics.median(ours), statistics.median(bare)
    print("installation:               %s" % ("fresh non-editable pip install" if args.fresh_install
                                             else "this tree's .venv (editable)"))
    print("home in:                    %s" % os.path.dirname(base))
    print("messages queued:            %d of %d (%d failures)" % (queued, args.n, failures))
    print("messages/s:                 %.1f" % (args.n / total))
    print("median per message:         %.2f ms  (QMAILHOME/bin/qmail-queue, %d runs)" % (
        med_ours * 1000, len(ours)))
    print("median bare python start:   %.2f ms  (%s -I -S -c pass, %d runs)" % (
        med_bare * 1000, python, len(bare)))
    print("ours / bare:                %.2f  (target <= %.1f)" % (med_ours / med_bare, TARGET))
    print("share spent starting Python: %.0f%%" % (100 * min(1.0, med_bare / med_ours)))
    return 0 if failures == 0 and queued == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
