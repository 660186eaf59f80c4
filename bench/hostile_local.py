#!/usr/bin/env python3
"""A seeded hostile-local-user campaign: nothing an ordinary user sends stops anyone else's mail.

    .venv/bin/python bench/hostile_local.py [--count 300] [--seconds 240] [--seed 1]
                                            [--backend dir|log|both] [--rate 5] [--bound 10]

A throw-away home (bench/deliver.py's make_home) with qmail-qmqpd and
`qmail-start ./Maildir/` running. The hostile user is, as root, an account made
for the run (qmailpy-hostile, removed at the end), and otherwise the invoking
user of the single-user home. Its generated inputs (random.Random(seed), at most
--count per interface, all of them within --seconds) go to every interface an
ordinary user reaches (docs/security.md):

  qmqp       the queue socket run/qmqp.sock: random bytes, lengths past any limit,
             cut netstrings, requests with odd addresses and many recipients,
             slowloris (a byte at a time) and bursts of idle connections
  sendmail   sendmail with generated argv (options and addresses) and generated
             header blocks on stdin, -bs with a generated SMTP dialogue
  dotqmail   its own ~/.qmail-EXT files with generated lines (deliveries, programs,
             forwards, garbage, long lines, a FIFO, a symlink to /etc/shadow), each
             then sent a message through the socket
  command    files in queue/command/ (generated commands and garbage) and the
             trigger; as root the hostile user may not write there, and each try
             counts as refused

Meanwhile another user's mail flows: --rate messages a second from this process
through the socket to bench@ (its Maildir), each stamped X-Flow-Id. The run prints,
per backend:

  tried       generated inputs per interface (refused: the kernel's permissions
              stopped them before any daemon saw them)
  tracebacks  Python tracebacks in any daemon's log (qmail-send with its helpers
              and deliveries, qmail-qmqpd) or in sendmail's stderr (want 0)
  flow        the other user's messages sent, accepted, delivered
  delayed     accepted and delivered later than --bound seconds after sending (want 0)
  lost        accepted and never delivered (want 0; waited for up to --drain s)

Exit status 1 when there were tracebacks, delayed or lost mail (the home is then kept).
"""
import argparse
import json
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from deliver import make_home, start_qmqpd, start_send  # noqa: E402

HOSTILE = "qmailpy-hostile"          # the account made for the run, as root

# Run as the hostile user: argv home, hostile's home, seed, count, seconds.
# One JSON line at the end: {"tried": {...}, "refused": {...}, "tracebacks": [...]}.
ATTACKER = r'''
import json, os, random, socket, stat, subprocess, sys, time
home, own, seed, count, seconds = sys.argv[1:]
rng = random.Random(int(seed))
count, end = int(count), time.monotonic() + float(seconds)
sock_path = os.path.join(home, "run", "qmqp.sock")
tried = {"qmqp": 0, "sendmail": 0, "dotqmail": 0, "command": 0}
refused = {"command": 0}
tracebacks = []

def netstring(b):
    return b"%d:%s," % (len(b), b)

def junk(n):
    return bytes(rng.randrange(256) for _ in range(n))

def address():
    kind = rng.randrange(8)
    if kind == 0:
        return junk(rng.randrange(1, 40))
    if kind == 1:
        return b"x" * rng.choice((0, 1, 255, 1000, 70000)) + b"@bench.example"
    if kind == 2:
        return b"hostile-sink@bench.example\0evil"
    if kind == 3:
        return b"\"quoted local\"@bench.example"
    if kind == 4:
        return b"@route,@x:hostile-sink@bench.example"
    return b"hostile-sink@bench.example"

def qmqp_bytes():
    kind = rng.randrange(8)
    if kind == 0:
        return junk(rng.randrange(0, 300))
    if kind == 1:
        return b"%d:" % rng.choice((10 ** 20, 2 ** 63, 2 ** 40, 2 ** 31)) + junk(rng.randrange(50))
    if kind == 2:
        return b"99999999999999999999999999999999999999"
    if kind == 3:
        body = netstring(b"Subject: hostile\n\nx\n") + netstring(address())
        body += b"".join(netstring(address()) for _ in range(rng.choice((0, 1, 3, 2000))))
        return netstring(body)
    if kind == 4:
        data = netstring(netstring(b"m\n") + netstring(b"a@b") + netstring(b"c@d"))
        return data[:rng.randrange(1, len(data))]
    if kind == 5:
        return b"12:" + netstring(b"x") + b"12,"
    if kind == 6:
        return netstring(netstring(junk(rng.randrange(2000))) + netstring(b"") + netstring(b""))
    return b"0:,"

def talk(data, slow=False):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(sock_path)
        if slow:
            for i in range(min(len(data), 10)):
                s.sendall(data[i:i + 1])
                time.sleep(0.2)
        else:
            s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        while s.recv(4096):
            pass
    except OSError:
        pass
    finally:
        s.close()

def qmqp_one():
    kind = rng.randrange(10)
    if kind == 0:
        held = []
        for _ in range(rng.choice((10, 30, 60))):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                held.append(s)
            except OSError:
                s.close()
                break
        time.sleep(1)
        for s in held:
            s.close()
    else:
        talk(qmqp_bytes(), slow=kind == 1)

OPTIONS = ["-t", "-i", "-oi", "-odq", "-odi", "-v", "-bp", "-bs", "-q", "-f", "-F", "-N", "-r",
           "-o", "-B", "-O", "-X", "-Z", "--", "-bm", "-em", "-oem", "-bv", "-C", "-h", "-L", "-V"]

def header_block():
    lines = []
    for _ in range(rng.randrange(0, 12)):
        name = rng.choice(["To", "Cc", "Bcc", "From", "Subject", "Resent-To", "Date", "Message-ID",
                           "Received", "X-" + "y" * rng.randrange(200), junk(8).decode("latin-1")])
        value = rng.choice(["hostile-sink@bench.example", "", "<>", "a, b,, c", "x" * 5000,
                            "\"unterminated", "(comment", "hostile-sink@bench.example\r",
                            junk(30).decode("latin-1")])
        lines.append("%s: %s" % (name, value))
        if rng.random() < 0.1:
            lines.append(" continued " + "z" * rng.randrange(100))
    return ("\n".join(lines) + "\n\nbody\n").encode("latin-1", "replace")

def sendmail_one():
    argv = ["sendmail"]
    for _ in range(rng.randrange(0, 5)):
        argv.append(rng.choice(OPTIONS))
        if rng.random() < 0.5:
            argv.append(rng.choice(["hostile-sink@bench.example", "", "x" * 3000, "-", "\x7f",
                                    "a@b@c", "<>", junk(10).replace(b"\0", b"").decode("latin-1")]))
    if rng.random() < 0.7:
        argv.append("hostile-sink@bench.example")
    if "-bs" in argv:
        stdin = rng.choice([b"HELO x\r\nMAIL FROM:<a@b>\r\nRCPT TO:<hostile-sink@bench.example>\r\n"
                            b"DATA\r\nSubject: s\r\n\r\nx\r\n.\r\nQUIT\r\n", junk(200),
                            b"MAIL FROM:<" + b"x" * 3000 + b">\r\nQUIT\r\n"])
    else:
        stdin = header_block()
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=30)
        if b"Traceback" in done.stderr:
            tracebacks.append("sendmail %r: %s" % (argv[:6], done.stderr[-600:].decode("latin-1")))
    except subprocess.TimeoutExpired:
        tracebacks.append("sendmail %r: no exit in 30 s" % (argv[:6],))

DOTQMAIL = ["./Maildir/", "./mbox", "|exit 0", "|exit 100", "|cat >/dev/null", "&hostile-sink@bench.example",
            "&bench-nosuch@bench.example", "#comment", "", "./nonexistent/", "/tmp/", "|" + "x" * 5000,
            "&", "&<>", "./" + "y" * 1000, " ./Maildir/", "|exec 1>&-; exit 0", "|printf 'ZZ\\n'",
            "&hostile-loop@bench.example"]

def send(local):
    from qmailpy.queue.qmqp import exchange, request
    try:
        exchange(sock_path, request(b"Subject: dotqmail\n\nhi\n", b"hostile@bench.example",
                                    [local + b"@bench.example"]), 30)
    except OSError:
        pass

def dotqmail_one(i):
    name = "g%d" % i
    path = os.path.join(own, ".qmail-" + name)
    kind = rng.randrange(12)
    try:
        if os.path.lexists(path):
            os.unlink(path)
        if kind == 0:
            os.symlink("/etc/shadow", path)
        elif kind == 1:
            os.mkfifo(path)
        else:
            lines = [rng.choice(DOTQMAIL) for _ in range(rng.randrange(1, 6))]
            if kind == 2:
                lines.append(junk(rng.randrange(300)).decode("latin-1"))
            with open(path, "w", encoding="latin-1") as f:
                f.write("\n".join(lines) + ("\n" if rng.random() < 0.8 else ""))
            os.chmod(path, rng.choice((0o600, 0o644, 0o666, 0o000)))
    except OSError:
        pass
    send(b"hostile-" + name.encode())

def command_one():
    cdir = os.path.join(home, "queue", "command")
    name = rng.choice(["c%d" % rng.randrange(10 ** 6), ".c%d" % rng.randrange(10 ** 6),
                       "c%d.reply" % rng.randrange(100), "c%d.work" % rng.randrange(100)])
    data = rng.choice([b"action delete\nmsg 1\n", b"action bounce\nreason " + b"r" * 5000 + b"\nmsg 2\n",
                       b"action hold\n" + b"".join(b"msg %d\n" % rng.randrange(2 ** 64) for _ in range(50)),
                       b"action nuke\nmsg 1\n", junk(rng.randrange(500)), b"msg 18446744073709551616\n",
                       b"action requeue\nmsg -1\n", b""])
    try:
        with open(os.path.join(cdir, name), "wb") as f:
            f.write(data)
        fd = os.open(os.path.join(home, "queue", "lock", "trigger"), os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"\0")
        os.close(fd)
    except PermissionError:
        refused["command"] += 1
    except OSError:
        pass

steps = {"qmqp": qmqp_one, "sendmail": sendmail_one, "command": command_one}
for i in range(count):
    for kind in ("qmqp", "sendmail", "dotqmail", "command"):
        if time.monotonic() > end:
            break
        tried[kind] += 1
        dotqmail_one(i) if kind == "dotqmail" else steps[kind]()
print(json.dumps({"tried": tried, "refused": refused, "tracebacks": tracebacks}), flush=True)
'''


def hostile_account(base):
    """(name, uid, gid, home) of the hostile user: as root an account made here."""
    own = os.path.join(base, "hostile")
    if os.geteuid() != 0:
        pw = pwd.getpwuid(os.geteuid())
        os.mkdir(own, 0o755)
        return pw.pw_name, pw.pw_uid, pw.pw_gid, own
    try:
        pwd.getpwnam(HOSTILE)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", HOSTILE],
                       check=True)
    pw = pwd.getpwnam(HOSTILE)
    os.mkdir(own, 0o755)
    os.chown(own, pw.pw_uid, pw.pw_gid)
    return pw.pw_name, pw.pw_uid, pw.pw_gid, own


def add_hostile_user(home, account):
    """users/assign: hostile-EXT@ to the hostile user's ~/.qmail-EXT (dash '-')."""
    name, uid, gid, own = account
    path = os.path.join(home, "users", "assign")
    with open(path) as f:
        text = f.read()
    text = text.replace(".\n", "+hostile-:%s:%d:%d:%s:-::\n.\n" % (name, uid, gid, own))
    with open(path, "w") as f:
        f.write(text)
    for sub in ("Maildir", "Maildir/new", "Maildir/cur", "Maildir/tmp"):
        os.mkdir(os.path.join(own, sub), 0o700)
        if os.geteuid() == 0:
            os.chown(os.path.join(own, sub), uid, gid)
    with open(os.path.join(own, ".qmail-sink"), "w") as f:
        f.write("./Maildir/\n")
    if os.geteuid() == 0:
        os.chown(os.path.join(own, ".qmail-sink"), uid, gid)


class Flow:
    """The other user's mail: a message every 1/rate s through the socket, X-Flow-Id i."""

    def __init__(self, home, rate):
        self.home, self.rate = home, rate
        self.sent, self.accepted = {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from qmailpy.queue.qmqp import exchange, request
        path = os.path.join(self.home, "run", "qmqp.sock")
        i = 0
        while not self.stop.is_set():
            t = time.time()
            self.sent[i] = t
            try:
                answer = exchange(path, request(b"X-Flow-Id: %d\nSubject: flow\n\nflow %d\n" % (i, i),
                                                b"flow@bench.example", [b"bench@bench.example"]), 60)
            except OSError:
                answer = b""
            if answer.startswith(b"K"):
                self.accepted[i] = t
            i += 1
            self.stop.wait(max(0.0, 1.0 / self.rate - (time.time() - t)))


def delivered(maildir):
    """{flow id: delivery time (the file's mtime)}."""
    found = {}
    for sub in ("new", "cur"):
        d = os.path.join(maildir, sub)
        for name in os.listdir(d):
            path = os.path.join(d, name)
            try:
                with open(path, "rb") as f:
                    head = f.read(4096)
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            at = head.find(b"X-Flow-Id: ")
            if at >= 0:
                found[int(head[at + 11:head.index(b"\n", at)])] = mtime
    return found


def tracebacks_in(paths):
    seen = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        start = 0
        while True:
            at = data.find(b"Traceback", start)
            if at < 0:
                break
            seen.append("%s: %s" % (os.path.basename(path), data[at:at + 800].decode("utf-8", "replace")))
            start = at + 1
    return seen


def campaign(args, backend):
    base = tempfile.mkdtemp(prefix="qmailpy-hostile-")
    os.chmod(base, 0o755)
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    home, maildir, env = make_home(base, user, backend)
    account = hostile_account(base)
    add_hostile_user(home, account)
    send_log, qmqpd_log = os.path.join(base, "qmail-send.log"), os.path.join(base, "qmail-qmqpd.log")
    qmqpd = start_qmqpd(env, qmqpd_log)
    send = start_send(env, send_log)
    flow = Flow(home, args.rate)
    flow.thread.start()
    attacker_env = dict(env, HOME=account[3], USER=account[0], LOGNAME=account[0])
    started = time.time()
    try:
        done = subprocess.run(
            [sys.executable, "-c", ATTACKER, home, account[3], str(args.seed), str(args.count),
             str(args.seconds)], env=attacker_env, cwd=account[3], capture_output=True,
            timeout=args.seconds + 300,
            **({"user": account[1], "group": account[2], "extra_groups": []} if os.geteuid() == 0 else {}))
        result = json.loads(done.stdout.decode().strip().splitlines()[-1]) if done.stdout.strip() else {
            "tried": {}, "refused": {}, "tracebacks": ["attacker: " + done.stderr[-2000:].decode("latin-1")]}
        if b"Traceback" in done.stderr:
            result["tracebacks"].append("attacker: " + done.stderr[-2000:].decode("latin-1"))
    finally:
        flow.stop.set()
        flow.thread.join()
    attack_seconds = time.time() - started
    deadline = time.time() + args.drain
    got = delivered(maildir)
    while time.time() < deadline and not set(flow.accepted) <= set(got):
        time.sleep(0.5)
        got = delivered(maildir)
    lost = sorted(set(flow.accepted) - set(got))
    delayed = sorted(i for i in flow.accepted if i in got and got[i] - flow.accepted[i] > args.bound)
    worst = max((got[i] - flow.accepted[i] for i in flow.accepted if i in got), default=0.0)
    for proc in (send, qmqpd):
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    seen = result["tracebacks"] + tracebacks_in([send_log, qmqpd_log])
    print("%s backend (%.0f s of attacks as %s):" % (backend, attack_seconds, account[0]))
    print("  tried       %s" % ", ".join("%s %d" % kv for kv in result["tried"].items()))
    if any(result["refused"].values()):
        print("  refused     %s" % ", ".join("%s %d" % kv for kv in result["refused"].items()))
    print("  tracebacks  %d" % len(seen))
    for text in seen[:5]:
        print("    " + text.replace("\n", "\n    ")[:1500])
    print("  flow        sent %d, accepted %d, delivered %d (slowest %.1f s)" % (
        len(flow.sent), len(flow.accepted), len(set(flow.accepted) & set(got)), worst))
    print("  delayed     %d (more than %g s)" % (len(delayed), args.bound))
    print("  lost        %d" % len(lost))
    bad = bool(seen or delayed or lost or len(flow.accepted) < len(flow.sent))
    if bad:
        print("  home kept: %s" % base)
    else:
        shutil.rmtree(base, ignore_errors=True)
    return bad


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=300, help="generated inputs per interface at most")
    parser.add_argument("--seconds", type=float, default=240.0, help="time for all the attacks at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=("dir", "log", "both"), default="both")
    parser.add_argument("--rate", type=float, default=5.0, help="the other user's messages per second")
    parser.add_argument("--bound", type=float, default=10.0,
                        help="seconds from sending to delivery beyond which a message counts as delayed")
    parser.add_argument("--drain", type=float, default=120.0,
                        help="seconds to wait after the attacks for the other user's mail")
    args = parser.parse_args()
    bad = False
    for backend in (("dir", "log") if args.backend == "both" else (args.backend,)):
        bad = campaign(args, backend) or bad
    if os.geteuid() == 0:
        subprocess.run(["userdel", HOSTILE], capture_output=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
