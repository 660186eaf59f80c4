"""Power cuts at every point of a protocol: the crash-state explorer (tests/crashstates.py).

Each test records a protocol's file-system calls with strace against a real home, builds
every disk state a power cut may leave (prefixes, unsynced operations lost, the last
unsynced write torn), and for each one runs the real recovery and checks what a user
sees: every message acknowledged before the crash (its qmail-queue exited 0) is in the
recipients' Maildirs at least once, every delivered message is whole, and qmail-send
leaves no envelope behind. On the log backend a new qmail-queue arrives before
qmail-send starts, as after a boot where nothing orders the two, and the disk is from
a previous boot (the commit word's boot id is not this boot's).

The default run explores every distinct state of each protocol; CRASHSTATES_FULL=1 adds
the longer protocols. The number of states explored is printed per protocol.
"""
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys

import psutil
import pytest
from inotify_simple import INotify, flags

import crashstates as cs
from conftest import AS_ROOT, make_home, traversable_base
from lspawn_harness import LocalUsers
from queue_view import leftovers
from send_harness import Daemons

pytestmark = pytest.mark.skipif(not cs.strace_available(), reason="strace is not installed")

FULL = os.environ.get("CRASHSTATES_FULL") == "1"
LIMIT = int(os.environ.get("CRASHSTATES_LIMIT", "0")) or None
RCPTS = ["a@test.example", "b@test.example"]

DRIVER = r'''
import json, os, subprocess, sys
home, manifest, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
env = dict(os.environ, QMAILHOME=home, PATH=os.path.join(home, "bin") + os.pathsep + os.environ["PATH"])
pids = {}
for batch in spec:                      # the runs of one batch run at the same time
    procs = []
    for tag, rcpts in batch:
        r, w = os.pipe()
        p = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=r, env=env)
        os.close(r)
        procs.append((p, w, tag, rcpts))
    for p, w, tag, rcpts in procs:
        p.stdin.write(%(message)s %% (tag.encode(), tag.encode()))
        p.stdin.close()
        os.write(w, b"Fjoe@test.example\0" + b"".join(b"T" + r.encode() + b"\0" for r in rcpts) + b"\0")
        os.close(w)
    for p, w, tag, rcpts in procs:
        assert p.wait() == 0, tag
        pids[p.pid] = tag
with open(manifest, "w") as f:
    json.dump(pids, f)
'''
MESSAGE = b"X-Crash-Id: %s\nSubject: crash\n\nmessage %s\n"
AFTER = "after"                         # the message queued after the crash


def message(tag):
    return MESSAGE % (tag.encode(), tag.encode())


class Explorer:
    """A home with users a and b, a protocol recorded on it, and the checks per state."""

    def __init__(self, base, backend):
        self.base = base
        self.home = make_home(base, backend)
        self.backend = backend
        users = LocalUsers(self.home)
        self.maildirs = {r: os.path.join(users.add(r.split("@")[0]), "Maildir") for r in RCPTS}
        self.pre = os.path.join(base, "pre")
        self.post = os.path.join(base, "post")
        self.spec = {}

    def record_queue_runs(self, batches):
        """Record batches of concurrent qmail-queue runs: [[(tag, recipients), ...], ...]."""
        subprocess.run(["cp", "-a", self.home.queue, self.pre], check=True)
        driver = os.path.join(self.base, "driver.py")
        with open(driver, "w") as f:
            f.write(DRIVER % {"message": repr(MESSAGE)})
        manifest = os.path.join(self.base, "manifest")
        for batch in batches:
            for tag, rcpts in batch:
                self.spec[tag] = rcpts
        trace = cs.record([sys.executable, driver, self.home.path, manifest, json.dumps(batches)],
                          self.home.queue, self.pre, self.base, env=self.home.env)
        with open(manifest) as f:
            pids = {int(k): v for k, v in json.load(f).items()}
        rec = cs.parse(trace, self.home.queue, self.pre, pids)
        assert set(rec.acks) == set(self.spec), (rec.acks, pids)
        # Keep the run's files (and so their inode numbers, which name messages) allocated:
        # a real disk still holds them, so no new message may take their numbers.
        os.rename(self.home.queue, self.post)
        self.owner_of = cs.owners(self.post, self.pre)
        return rec

    # -- one crash state -------------------------------------------------------------
    def explore(self, rec, limit=None):
        """Check every state; returns (count, failures)."""
        found = cs.states(rec)
        failures = []
        for state, tree in found[:limit]:
            problem = self.check(rec, state, tree)
            if problem:
                failures.append("%s\n    %s" % (state.describe(rec), problem))
        return len(found[:limit]), failures

    def check(self, rec, state, tree):
        cs.materialise(tree, self.home.queue, self.owner_of)
        for md in self.maildirs.values():
            for sub in ("new", "cur", "tmp"):
                for name in os.listdir(os.path.join(md, sub)):
                    os.unlink(os.path.join(md, sub, name))
        expected = {tag: self.spec[tag] for tag, at in rec.acks.items() if at <= state.prefix}
        if self.backend == "log":
            from_previous_boot(self.home.queue)
            done = self.home.queue_message(message(AFTER), b"joe@test.example", [RCPTS[0].encode()])
            if done.returncode != 0:
                return "qmail-queue after the crash exited %d: %s" % (done.returncode, done.stderr[-300:])
            expected[AFTER] = [RCPTS[0]]
        log = os.path.join(self.base, "work", "send.log")
        if os.path.exists(log):
            os.unlink(log)
        d = Daemons(self.home)
        try:
            d.start()
            try:
                self.wait_delivered(expected)
                lines = d.wait_for(settled, 30, "every new msg ended")
            except AssertionError as e:
                return "not delivered: %s" % str(e)[:1500]
        finally:
            power_off(d)
        problems = []
        delivered = self.delivered()
        for tag, rcpts in expected.items():
            for r in rcpts:
                if tag not in delivered[r]:
                    problems.append("acknowledged %s never reached %s" % (tag, r))
        for r, got in delivered.items():
            for tag, whole in got.items():
                if not whole:
                    problems.append("%s got %s torn" % (r, tag))
        # qmail-send may be killed between "end msg" and its last bookkeeping (which a
        # restart redoes); a message it never ended is stranded.
        ended = {l.split()[2] for l in lines if l.startswith("end msg ")}
        stuck = [x for x in leftovers(self.home)
                 if not x.startswith(("mess/", "intd/", "log/")) and re.sub(r"\D+", " ", x).split()[-1:] != []
                 and re.sub(r"\D+", " ", x).split()[-1] not in ended]
        if stuck:
            problems.append("left in the queue: %s" % stuck)
        warnings = [l for l in lines if re.match(r"^(warning|alert):", l)]
        if problems:
            return "; ".join(problems) + ("\n    log: %s" % warnings if warnings else "")
        return None

    def delivered(self):
        """{recipient: {tag: whole?}} from the Maildirs."""
        out = {}
        for r, md in self.maildirs.items():
            got = out[r] = {}
            for name in os.listdir(os.path.join(md, "new")):
                with open(os.path.join(md, "new", name), "rb") as f:
                    data = f.read()
                m = re.search(rb"^X-Crash-Id: (\S+)$", data, re.M)
                tag = m.group(1).decode() if m else "?"
                got[tag] = got.get(tag, True) and data.endswith(message(tag))
        return out

    def wait_delivered(self, expected, timeout=30):
        """Wait (inotify on each Maildir/new) until every expected recipient has its copy."""
        ino = INotify()
        for md in self.maildirs.values():
            ino.add_watch(os.path.join(md, "new"), flags.MOVED_TO | flags.CREATE)
        deadline = timeout
        import time
        end = time.monotonic() + deadline
        while True:
            got = self.delivered()
            missing = [(t, r) for t, rs in expected.items() for r in rs if t not in got[r]]
            if not missing:
                return
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("missing deliveries %s" % missing)
            ino.read(timeout=int(min(left, 1.0) * 1000))


def power_off(d):
    """SIGKILL qmail-start's whole session and wait (pidfd) until every process is gone:
    once settled, what is on disk is what counts."""
    try:
        procs = [d.proc.pid] + [p.pid for p in psutil.Process(d.proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = [d.proc.pid]
    fds = []
    for pid in procs:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    try:
        os.killpg(d.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    d.proc.wait(timeout=30)
    for fd in fds:
        select.select([fd], [], [], 30)
        os.close(fd)


def settled(lines):
    """Every message qmail-send took up has ended."""
    new = {l.split()[2] for l in lines if l.startswith("new msg ")}
    end = {l.split()[2] for l in lines if l.startswith("end msg ")}
    return new <= end and any(l.startswith("status: local") for l in lines)


def from_previous_boot(queue):
    """The log's commit word as a previous boot left it: its boot id is not this boot's."""
    path = os.path.join(queue, "log", "commit")
    try:
        with open(path, "r+b") as f:
            data = f.read()
            if len(data) >= 56:
                f.seek(48)
                f.write(struct.pack("<Q", 0x0123456789ABCDEF))
    except FileNotFoundError:
        pass


@pytest.fixture
def explorer_base(tmp_path):
    base = traversable_base(tmp_path, "qmailpy-crashstates-")
    try:
        yield base
    finally:
        if AS_ROOT:
            shutil.rmtree(base, ignore_errors=True)


def report(name, count, failures):
    print("crash states explored: %s: %d, failing: %d" % (name, count, len(failures)))
    assert not failures, "%d of %d crash states fail:\n%s" % (
        len(failures), count, "\n".join(failures[:10]))


GROUP_COMMIT = [[("m1", RCPTS), ("m2", RCPTS), ("m3", RCPTS)], [("m4", RCPTS)]]


def test_log_group_commit_then_a_fourth_message(explorer_base):
    """The issue's reproduction: three concurrent qmail-queues, then a fourth."""
    ex = Explorer(explorer_base, "log")
    rec = ex.record_queue_runs(GROUP_COMMIT)
    report("log qmail-queue x3 (group commit) + 1", *ex.explore(rec, LIMIT))
