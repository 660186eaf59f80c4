#!/usr/bin/env python3
"""A seeded SIGKILL campaign against the running daemons: nothing acknowledged is lost.

    .venv/bin/python bench/kill_campaign.py [--kills 5000] [--seed 1] [--backend dir|log|both]
                                            [--via qmail-queue|qmqpd] [--rate 100]

A throw-away home (bench/deliver.py's make_home), qmail-send started with
`qmail-start ./Maildir/`, remote mail routed (control/smtproutes) to an aiosmtpd
peer on 127.0.0.1. An injector queues messages at about --rate per second, each to
one local and one remote recipient and carrying `X-Kill-Id: i`, and records i
once it was acknowledged: with --via qmail-queue (the default) a forked child
running qmail-queue's code exited 0; with --via qmqpd qmail-qmqpd (started here
from QMAILHOME/bin) answered K on its local socket. Meanwhile a killer, driven by
random.Random(seed), SIGKILLs one process at a time, chosen among the live
delivery children (qmail-local's forks under qmail-lspawn, qmail-remote under
qmail-rspawn), the injector's qmail-queue children (or qmail-qmqpd's children and
qmail-qmqpd itself), qmail-lspawn, qmail-rspawn, qmail-clean and qmail-send, with
the weights in VICTIMS. Whenever qmail-send (or qmail-qmqpd) is gone, killed or
exiting because it lost a helper, it is started again, as systemd's Restart=always
does. After --kills kills the injector stops and every retry is forced (SIGALRM)
until every acknowledged message reached both recipients, for as long as
deliveries keep arriving (the run gives up after --drain seconds without a new
one); then, retries still forced, until the queue is empty (at most --settle
seconds). The run prints, per backend, counted at the end:

  accepted     messages acknowledged
  delivered    of those, delivered to both recipients
  duplicates   extra deliveries (a delivery repeated after a kill: allowed)
  lost         acknowledged but never delivered to a recipient (must be 0)
  unacked      delivered although the acknowledgement never reached the injector
               (killed after the message was durable: allowed)
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
from deliver import make_home, program_name, start_qmqpd  # noqa: E402
from queue_view import leftovers  # noqa: E402
from remote_harness import Smtpd  # noqa: E402

VICTIMS = (("delivery child", 40), ("qmail-queue child", 20), ("qmail-remote", 15),
           ("qmail-lspawn", 6), ("qmail-rspawn", 6), ("qmail-clean", 6), ("qmail-send", 7))
# --via qmqpd: qmail-qmqpd's children queue instead of the injector's, and the server dies too
VICTIMS_QMQPD = (("delivery child", 40), ("qmail-qmqpd child", 15), ("qmail-qmqpd", 5),
                 ("qmail-remote", 15), ("qmail-lspawn", 6), ("qmail-rspawn", 6), ("qmail-clean", 6),
                 ("qmail-send", 7))

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

INJECTOR_QMQPD = r'''
import os, sys, time
from qmailpy.queue.qmqp import exchange, request
home, out, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
path = os.path.join(home, "run", "qmqp.sock")
i = 0
with open(out, "a", buffering=1) as acked:
    while not os.path.exists(out + ".stop"):
        start = time.monotonic()
        try:
            answer = exchange(path, request(b"X-Kill-Id: %d\nSubject: kill campaign\n\nmessage %d\n" % (i, i),
                                            b"sender@bench.example",
                                            [b"bench@bench.example", b"r%d@far.example" % i]), 60)
        except Exception:               # the server is down (killed) or died mid-request
            answer = b""
        if answer.startswith(b"K"):
            acked.write("%d\n" % i)
        i += 1
        time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - start)))
'''


def start_send(env, logpath):
    log = open(logpath, "ab")
    return subprocess.Popen(["qmail-start", "./Maildir/"], stdout=log, stderr=log, env=env,
                            cwd="/", start_new_session=True)


def victims(send, injector, qmqpd, table):
    """{kind: [psutil.Process]} of what is alive now."""
    found = {kind: [] for kind, _ in table}
    if qmqpd is not None:
        try:
            found["qmail-qmqpd"].append(qmqpd)
            found["qmail-qmqpd child"] += qmqpd.children()
        except psutil.Error:
            pass
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
    if "qmail-queue child" in found:
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


def remote_ids(peer):
    return [int(r.split("@")[0][1:]) for t in list(peer.transactions) for r in t.rcpt_tos]


def campaign(args, backend):
    base = tempfile.mkdtemp(prefix="qmailpy-kill-")
    os.chmod(base, 0o755)
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    home, maildir, env = make_home(base, user, backend)
    rng = random.Random(args.seed)
    table = VICTIMS_QMQPD if args.via == "qmqpd" else VICTIMS
    kinds = [k for k, _ in table]
    weights = [w for _, w in table]
    killed = {k: 0 for k in kinds}
    restarts = qmqpd_restarts = 0
    with Smtpd() as peer:
        with open(os.path.join(home, "control", "smtproutes"), "w") as f:
            f.write("far.example:127.0.0.1:%d\n" % peer.port)
        logpath = os.path.join(base, "send.log")
        qmqpd_log = os.path.join(base, "qmqpd.log")
        acked_path = os.path.join(base, "acked")
        send = start_send(env, logpath)
        qmqpd = start_qmqpd(env, qmqpd_log) if args.via == "qmqpd" else None
        injector = subprocess.Popen([sys.executable, "-c", INJECTOR_QMQPD if qmqpd else INJECTOR,
                                     home, acked_path, str(args.rate)], env=env)

        def keep_running():
            nonlocal send, qmqpd, restarts, qmqpd_restarts
            if send.poll() is not None:
                send = start_send(env, logpath)
                restarts += 1
            if qmqpd is not None and qmqpd.poll() is not None:
                qmqpd = start_qmqpd_appending(env, qmqpd_log)
                qmqpd_restarts += 1

        started = time.monotonic()
        try:
            while sum(killed.values()) < args.kills:
                keep_running()
                time.sleep(rng.uniform(0.002, 0.02))
                kind = rng.choices(kinds, weights)[0]
                alive = victims(psutil.Process(send.pid), psutil.Process(injector.pid),
                                psutil.Process(qmqpd.pid) if qmqpd else None, table)[kind]
                if not alive:
                    continue
                try:
                    rng.choice(alive).send_signal(signal.SIGKILL)
                    killed[kind] += 1
                except psutil.Error:
                    pass
            killing = time.monotonic() - started
            open(acked_path + ".stop", "w").close()
            injector.wait(timeout=120)
            with open(acked_path) as f:
                acked = {int(line) for line in f}
            # drain: force retries while deliveries keep arriving, until every acknowledged
            # message is at both recipients (a backlog left by the kills takes long under load)
            drain_start = last_progress = time.monotonic()
            seen = -1
            while True:
                keep_running()
                local, remote = delivered_ids(maildir), remote_ids(peer)
                if acked <= set(local) and acked <= set(remote):
                    break
                if len(local) + len(remote) > seen:
                    seen, last_progress = len(local) + len(remote), time.monotonic()
                elif time.monotonic() > last_progress + args.drain:
                    break
                send.send_signal(signal.SIGALRM)
                time.sleep(0.5)
            drained = time.monotonic() - drain_start
            # settle: everything is delivered; the queue must empty (retries still forced)
            deadline = time.monotonic() + args.settle
            while True:
                keep_running()
                stuck = stuck_in_queue(home)
                if not stuck or time.monotonic() > deadline:
                    break
                send.send_signal(signal.SIGALRM)
                time.sleep(0.5)
            local, remote = delivered_ids(maildir), remote_ids(peer)     # the final count
            elapsed = time.monotonic() - started
        finally:
            if injector.poll() is None:
                injector.kill()
            for proc in (send, qmqpd):
                if proc is None:
                    continue
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    lost = sorted(i for i in acked if i not in set(local) or i not in set(remote))
    everything = local + remote
    distinct = len(set(local)) + len(set(remote))
    unacked = sorted((set(local) | set(remote)) - acked)
    print("== backend %s, via %s, seed %d" % (backend, args.via, args.seed))
    print("kills: %d (%s); restarts: qmail-send %d%s; %.0f s (kills %.0f, drain %.0f)" % (
        sum(killed.values()), ", ".join("%s %d" % kv for kv in killed.items()), restarts,
        ", qmail-qmqpd %d" % qmqpd_restarts if qmqpd is not None else "", elapsed, killing, drained))
    print("accepted %d, delivered %d, duplicates %d, lost %d, unacked %d, stuck %d" % (
        len(acked), len(acked) - len(lost), len(everything) - distinct, len(lost), len(unacked),
        sum(1 for p in stuck if not p.startswith("log/"))))
    sys.stdout.flush()
    if lost:
        print("lost: %s" % lost[:20])
    if stuck:
        print("stuck after %d s: %s" % (args.settle, stuck[:20]))
    if lost or stuck:
        print("kept %s (send.log: qmail-send's log)" % base)
    else:
        subprocess.run(["rm", "-rf", base])
    sys.stdout.flush()
    return len(lost) + len(stuck)


def start_qmqpd_appending(env, logpath):
    """start_qmqpd, keeping the log of the runs before (it truncates its log)."""
    old = open(logpath, "rb").read() if os.path.exists(logpath) else b""
    with open(logpath + ".old", "ab") as f:
        f.write(old)
    return start_qmqpd(env, logpath)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=("dir", "log", "both"), default="both")
    parser.add_argument("--via", choices=("qmail-queue", "qmqpd"), default="qmail-queue",
                        help="how the injector queues: qmail-queue's code in a forked child, or qmail-qmqpd")
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second injected")
    parser.add_argument("--drain", type=float, default=300.0,
                        help="seconds without a new delivery after which the drain gives up")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds allowed for the queue to empty once everything is delivered")
    args = parser.parse_args()
    bad = 0
    for backend in (("dir", "log") if args.backend == "both" else (args.backend,)):
        bad += campaign(args, backend)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
