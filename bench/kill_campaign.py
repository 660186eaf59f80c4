#!/usr/bin/env python3
"""A seeded SIGKILL campaign against the running daemons: nothing acknowledged is lost.

    .venv/bin/python bench/kill_campaign.py [--kills 5000] [--seed 1] [--backend dir|log|both]
                                            [--rate 100]

A throw-away home (bench/deliver.py's make_home), qmail-send started with
`qmail-start ./Maildir/`, remote mail routed (control/smtproutes) to an aiosmtpd
peer on 127.0.0.1. An injector queues messages at about --rate per second, each to
one local and one remote recipient and carrying `X-Kill-Id: i`, and records i
once qmail-queue acknowledged it (exit 0). Meanwhile a killer, driven by
random.Random(seed), SIGKILLs one process at a time, chosen among the live
delivery children (qmail-local's forks under qmail-lspawn, qmail-remote under
qmail-rspawn), the injector's qmail-queue children, qmail-lspawn, qmail-rspawn,
qmail-clean and qmail-send, with the weights in VICTIMS. Whenever qmail-send is
gone (killed, or exiting because it lost a helper) it is restarted, as systemd's
Restart=always does. After --kills kills the injector stops, every retry is forced
(SIGALRM) until the queue is empty, and the run prints, per backend:

  accepted     messages qmail-queue acknowledged
  delivered    of those, delivered to both recipients
  duplicates   extra deliveries (a delivery repeated after a kill: allowed)
  lost         acknowledged but never delivered to a recipient (must be 0)
  unacked      delivered although qmail-queue's acknowledgement never reached the
               injector (its child was killed after the message was durable: allowed)
  stuck        messages the queue still holds --settle seconds after everything
               was delivered, retries forced all along (tests/queue_view.leftovers
               less S2/S3 debris: a message live in the log, or an info/, todo/,
               local/, remote/ or bounce/ file; must be 0)

Exit status 1 when anything was lost or stuck (the home is then kept). The same seed
gives the same sequence of victim choices (what is alive to be chosen depends on timing).
"""
import argparse
import os
import pwd
import random
import signal
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from deliver import make_home, program_name  # noqa: E402
from queue_view import leftovers  # noqa: E402
from remote_harness import Smtpd  # noqa: E402

VICTIMS = (("delivery child", 40), ("qmail-queue child", 20), ("qmail-remote", 15),
           ("qmail-lspawn", 6), ("qmail-rspawn", 6), ("qmail-clean", 6), ("qmail-send", 7))

INJECTOR = r'''
import os, sys, time
from qmailpy.queue.client import QueueClient
home, out, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
i = 0
with open(out, "a", buffering=1) as acked:
    while not os.path.exists(out + ".stop"):
        start = time.monotonic()
        qq = QueueClient(home)
        qq.write(b"X-Kill-Id: %d\nSubject: kill campaign\n\nmessage %d\n" % (i, i))
        r = qq.finish(b"sender@bench.example", [b"bench@bench.example", b"r%d@far.example" % i])
        if r.ok:
            acked.write("%d\n" % i)
        i += 1
        time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - start)))
'''


def start_send(env, logpath):
    log = open(logpath, "ab")
    return subprocess.Popen(["qmail-start", "./Maildir/"], stdout=log, stderr=log, env=env,
                            cwd="/", start_new_session=True)


def victims(send, injector):
    """{kind: [psutil.Process]} of what is alive now."""
    found = {kind: [] for kind, _ in VICTIMS}
    try:
        found["qmail-send"].append(send)
        for child in send.children():
            name = program_name(child.cmdline(), child.name())
            if name in found:
                found[name].append(child)
            if name == "qmail-lspawn":
                found["delivery child"] += child.children()
            elif name == "qmail-rspawn":
                found["qmail-remote"] += child.children()
    except psutil.Error:
        pass
    try:
        found["qmail-queue child"] += injector.children()
    except psutil.Error:
        pass
    return found


def delivered_ids(maildir):
    ids = []
    new = os.path.join(maildir, "new")
    for name in os.listdir(new):
        with open(os.path.join(new, name), "rb") as f:
            head = f.read(4096)
        ids.append(int(head.split(b"X-Kill-Id: ", 1)[1].split(b"\n", 1)[0]))
    return ids


class Home:
    """What queue_view.leftovers reads of a home."""
    def __init__(self, path):
        self.path, self.queue = path, os.path.join(path, "queue")


def stuck_in_queue(home):
    """Queue entries that are not S2/S3 debris (a mess/ or intd/ file a crash left)."""
    return [p for p in leftovers(Home(home)) if not p.startswith(("mess/", "intd/"))]


def campaign(args, backend):
    base = tempfile.mkdtemp(prefix="qmailpy-kill-")
    os.chmod(base, 0o755)
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    home, maildir, env = make_home(base, user, backend)
    rng = random.Random(args.seed)
    kinds = [k for k, _ in VICTIMS]
    weights = [w for _, w in VICTIMS]
    killed = {k: 0 for k in kinds}
    restarts = 0
    with Smtpd() as peer:
        with open(os.path.join(home, "control", "smtproutes"), "w") as f:
            f.write("far.example:127.0.0.1:%d\n" % peer.port)
        logpath = os.path.join(base, "send.log")
        acked_path = os.path.join(base, "acked")
        send = start_send(env, logpath)
        injector = subprocess.Popen([sys.executable, "-c", INJECTOR, home, acked_path, str(args.rate)],
                                    env=env)
        started = time.monotonic()
        try:
            while sum(killed.values()) < args.kills:
                if send.poll() is not None:
                    send = start_send(env, logpath)
                    restarts += 1
                time.sleep(rng.uniform(0.002, 0.02))
                kind = rng.choices(kinds, weights)[0]
                alive = victims(psutil.Process(send.pid), psutil.Process(injector.pid))[kind]
                if not alive:
                    continue
                try:
                    rng.choice(alive).send_signal(signal.SIGKILL)
                    killed[kind] += 1
                except psutil.Error:
                    pass
            open(acked_path + ".stop", "w").close()
            injector.wait(timeout=120)
            with open(acked_path) as f:
                acked = {int(line) for line in f}
            # drain: restart if needed, force retries until every acknowledged message is in
            deadline = time.monotonic() + args.drain
            while True:
                if send.poll() is not None:
                    send = start_send(env, logpath)
                    restarts += 1
                local = delivered_ids(maildir)
                remote = [int(r.split("@")[0][1:]) for t in list(peer.transactions) for r in t.rcpt_tos]
                if acked <= set(local) and acked <= set(remote) or time.monotonic() > deadline:
                    break
                send.send_signal(signal.SIGALRM)
                time.sleep(0.5)
            # settle: everything is delivered; the queue must empty (retries still forced)
            deadline = time.monotonic() + args.settle
            while True:
                if send.poll() is not None:
                    send = start_send(env, logpath)
                    restarts += 1
                stuck = stuck_in_queue(home)
                if not stuck or time.monotonic() > deadline:
                    break
                send.send_signal(signal.SIGALRM)
                time.sleep(0.5)
            elapsed = time.monotonic() - started
        finally:
            if injector.poll() is None:
                injector.kill()
            send.send_signal(signal.SIGTERM)
            try:
                send.wait(timeout=60)
            except subprocess.TimeoutExpired:
                send.kill()
    lost = sorted(i for i in acked if i not in set(local) or i not in set(remote))
    everything = local + remote
    distinct = len(set(local)) + len(set(remote))
    unacked = sorted((set(local) | set(remote)) - acked)
    print("== backend %s, seed %d" % (backend, args.seed))
    print("kills: %d (%s); qmail-send restarts: %d; %.0f s" % (
        sum(killed.values()), ", ".join("%s %d" % kv for kv in killed.items()), restarts, elapsed))
    print("accepted %d, delivered %d, duplicates %d, lost %d, unacked %d, stuck %d" % (
        len(acked), len(acked) - len(lost), len(everything) - distinct, len(lost), len(unacked),
        sum(1 for p in stuck if not p.startswith("log/"))))
    if lost:
        print("lost: %s" % lost[:20])
    if stuck:
        print("stuck after %d s: %s" % (args.settle, stuck[:20]))
    if lost or stuck:
        print("kept %s (send.log: qmail-send's log)" % base)
    else:
        subprocess.run(["rm", "-rf", base])
    return len(lost) + len(stuck)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=("dir", "log", "both"), default="both")
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second injected")
    parser.add_argument("--drain", type=float, default=600.0, help="seconds allowed to drain")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds allowed for the queue to empty once everything is delivered")
    args = parser.parse_args()
    bad = 0
    for backend in (("dir", "log") if args.backend == "both" else (args.backend,)):
        bad += campaign(args, backend)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
