"""The crash-state explorer's harness: Explorer (a home recorded under strace, its states
materialised and checked), the protocols' drivers and the predicates the tests choose states
with. The tests are tests/test_crash_states*.py (what they check: test_crash_states.py's
docstring); they import everything here.
"""
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

import psutil
import pytest
from inotify_simple import INotify, flags

import checkpoint_scenario
import crash_variants
import crashstates as cs
import knobs
import reuse_scenario
from conftest import AS_ROOT, make_home, traversable_base
from lspawn_harness import LocalUsers
from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import list_segments, segment_name
from qmailpy.layout import SPLIT, relpath
from queue_view import leftovers
from send_harness import Daemons

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not cs.strace_available(), reason="strace is not installed")]

FULL = knobs.CRASHSTATES_FULL
CAP = knobs.CRASHSTATES_CAP
# Breadth only the full run pays for: pairs of unsynced operations lost together (this
# many per prefix, a seeded sample where there are more) and earlier writes torn.
PAIRS = knobs.CRASHSTATES_PAIRS
RCPTS = ["a@test.example", "b@test.example"]
SENDER = "joe@test.example"
NOUSER = "nosuch@test.example"          # no such local user: its message bounces to SENDER
REMOTE = "r@far.example"                # add_peer(): delivered by qmail-remote to a peer
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "maildir_peer.py")
SCENARIO = os.path.abspath(checkpoint_scenario.__file__)
REUSE = os.path.abspath(reuse_scenario.__file__)

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
        os.write(w, b"F" + %(sender)s + b"\0" + b"".join(b"T" + r.encode() + b"\0" for r in rcpts) + b"\0")
        os.close(w)
    for p, w, tag, rcpts in procs:
        assert p.wait() == 0, tag
        pids[p.pid] = tag
with open(manifest, "w") as f:
    json.dump(pids, f)
'''
# qmail-qmqpd recorded with its clients: the driver starts the server, then runs each
# batch of requests at once, one forked client per request on the local socket; a client
# exits 0 only once it has read a K answer (qmail-qmqpd's acknowledgement).
QMQP_DRIVER = r'''
import json, os, subprocess, sys
from qmailpy.queue.qmqp import exchange, request
home, manifest, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
env = dict(os.environ, QMAILHOME=home, PATH=os.path.join(home, "bin") + os.pathsep + os.environ["PATH"])
server = subprocess.Popen(["qmail-qmqpd"], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
line = server.stderr.readline()
assert b"listening on" in line, line + server.stderr.read()
path = os.path.join(home, "run", "qmqp.sock")
pids = {}
for batch in spec:
    clients = []
    for tag, rcpts in batch:
        pid = os.fork()
        if pid == 0:
            answer = exchange(path, request(%(message)s %% (tag.encode(), tag.encode()), %(sender)s,
                                            [r.encode() for r in rcpts]), 60)
            os._exit(0 if answer.startswith(b"K") else 1)
        clients.append((pid, tag))
    for pid, tag in clients:
        assert os.waitpid(pid, 0)[1] == 0, tag
        pids[pid] = tag
server.terminate()
assert server.wait() == 0
with open(manifest, "w") as f:
    json.dump(pids, f)
'''
MESSAGE = b"X-Crash-Id: %s\nSubject: crash\n\nmessage %s\n"
AFTER = "after"                         # the message queued after the crash


def message(tag):
    return MESSAGE % (tag.encode(), tag.encode())


class Explorer:
    """A home with users a, b and joe (the sender, who gets the bounces), a protocol
    recorded on it, and the checks per crash state."""

    def __init__(self, base, backend):
        self.base = base
        self.home = make_home(base, backend)
        self.backend = backend
        self.users = users = LocalUsers(self.home)
        self.maildirs = {r: os.path.join(users.add(r.split("@")[0]), "Maildir") for r in RCPTS + [SENDER]}
        self.roots = {"queue": self.home.queue, "control": os.path.join(self.home.path, "control"),
                      "homes": users.base}
        self.pre = os.path.join(base, "pre")
        self.post = os.path.join(base, "post")
        self.spec = {}                  # tag -> the recipients that must get it at least once
        self.recovery = []              # commands an administrator runs before qmail-send
        self.peer_sock = None           # add_peer(): the remote host's listening socket
        self.peer_proc = None           # the remote host while states are checked
        self.forbidden = None           # a log line no state's recovery may write
        self.held = set()               # numbers (as text) of messages held for good
        self.own_recipients = False     # also: no one gets a message not sent to them

    # -- the remote host -----------------------------------------------------------------
    def add_peer(self):
        """far.example's host (tests/maildir_peer.py), routed by control/smtproutes: its
        Maildir is under the homes root, so a recording has its durable stores in order
        with qmail-send's records, and each state keeps what the peer had stored by then
        (the peer did not lose power; it made each message durable before its 250)."""
        self.peer_sock = socket.socket()
        self.peer_sock.bind(("127.0.0.1", 0))
        self.peer_sock.listen(64)
        self.home.control("smtproutes", "far.example:127.0.0.1:%d\n" % self.peer_sock.getsockname()[1])
        self.maildirs[REMOTE] = self.users.maildir(
            self.users.mkdir(os.path.join(self.users.base, "farpeer"), 0o755) + "/Maildir")

    def peer_argv(self, pidfile, then=()):
        argv = [sys.executable, PEER, str(self.peer_sock.fileno()), self.maildirs[REMOTE], pidfile]
        return argv + (["--then"] + list(then) if then else [])

    def start_peer(self):
        """The remote host for the recovery of each state (not recorded)."""
        if self.peer_sock is None or self.peer_proc is not None:
            return
        pidfile = os.path.join(self.base, "peer.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        self.peer_proc = subprocess.Popen(self.peer_argv(pidfile), pass_fds=[self.peer_sock.fileno()])
        wait_file(pidfile)

    def close(self):
        if self.peer_proc is not None:
            self.peer_proc.terminate()
            self.peer_proc.wait(timeout=30)
            self.peer_proc = None
        if self.peer_sock is not None:
            self.peer_sock.close()

    # -- before the recording: messages queued and acknowledged ------------------------
    def queue(self, tag, rcpts):
        done = self.home.queue_message(message(tag), SENDER.encode(), [r.encode() for r in rcpts])
        assert done.returncode == 0, done.stderr
        self.spec[tag] = [r for r in rcpts if r in self.maildirs] + ([SENDER] if NOUSER in rcpts else [])

    def deliver_all(self, count):
        """Deliver what is queued with the real daemons (not recorded), stop them, and
        empty the Maildirs."""
        log = os.path.join(self.base, "work", "send.log")
        if os.path.exists(log):
            os.unlink(log)
        d = Daemons(self.home)
        try:
            d.start()
            d.wait_idle(count)
        finally:
            d.stop()
        for md in self.maildirs.values():
            for sub in ("new", "cur"):
                for name in os.listdir(os.path.join(md, sub)):
                    os.unlink(os.path.join(md, sub, name))

    def fill_segment(self):
        """Log backend: fill the head segment with finished messages past 4 KB (the least
        segment size), then set control/logsegmentsize to its size, so that the next
        append rotates to a new segment and the old one is garbage to delete."""
        logdir = os.path.join(self.home.queue, "log")
        n = 0
        while True:
            segs = list_segments(logdir)
            size = os.path.getsize(os.path.join(logdir, segment_name(segs[-1]))) if segs else 0
            if size > 4200:
                break
            for _ in range(10):
                n += 1
                self.queue("fill%d" % n, [RCPTS[0]])
                del self.spec["fill%d" % n]
            self.deliver_all(10)
        self.home.control("logsegmentsize", "%d\n" % size)

    # -- recording ---------------------------------------------------------------------
    def _before_recording(self):
        cs.snapshot(self.roots, self.pre)
        # Files the run removes stay allocated (a real disk still holds them in the
        # states before the removal), so no later message takes their numbers.
        cs.hold(self.roots, os.path.join(self.base, "hold"))

    def _after_recording(self, trace, manifest):
        rec = cs.parse(trace, self.roots, self.pre, manifest)
        os.makedirs(self.post)
        for name, path in self.roots.items():
            os.rename(path, os.path.join(self.post, name))
        self.owner_of = cs.owners(self.post, self.pre)
        return rec

    def record_queue_runs(self, batches, driver_text=DRIVER, env=None):
        """Record batches of concurrent qmail-queue runs: [[(tag, recipients), ...], ...]
        (with QMQP_DRIVER, requests to qmail-qmqpd); env: added to the home's."""
        driver = os.path.join(self.base, "driver.py")
        with open(driver, "w") as f:
            f.write(driver_text % {"message": repr(MESSAGE), "sender": repr(SENDER.encode())})
        manifest = os.path.join(self.base, "manifest")
        self._before_recording()
        trace = cs.record([sys.executable, driver, self.home.path, manifest, json.dumps(batches)],
                          self.base, env=dict(self.home.env, **(env or {})))
        with open(manifest) as f:
            pids = {int(k): v for k, v in json.load(f).items()}
        for batch in batches:
            for tag, rcpts in batch:
                self.spec[tag] = rcpts
        rec = self._after_recording(trace, pids)
        assert set(rec.acks) == set(self.spec), (rec.acks, pids)
        return rec

    def record_send_run(self):
        """Record qmail-start (qmail-send, qmail-lspawn, qmail-rspawn, qmail-clean, the
        deliveries and the bounces they queue) until every queued message has ended;
        with add_peer(), the remote host (started first, in the same recording)."""
        self._before_recording()
        d = Daemons(self.home)
        d.offset_of_start = 0
        argv, pass_fds, peer_pid = ["qmail-start", "./Maildir/"], (), None
        if self.peer_sock is not None:
            peer_pid = os.path.join(self.base, "recorded-peer.pid")
            argv, pass_fds = self.peer_argv(peer_pid, argv), (self.peer_sock.fileno(),)
        with open(d.logpath, "wb") as log:
            d.proc, trace = cs.start_recording(argv, self.base, env=self.home.env, stdout=log,
                                               pass_fds=pass_fds)
        bounces = sum(1 for rcpts in self.spec.values() if SENDER in rcpts)
        try:
            if peer_pid:
                wait_file(peer_pid)
            d.wait_for(lambda l: sum(1 for x in l if x.startswith("end msg ")) >= len(self.spec) + bounces
                       and settled(l), 120, "every message ended")
            (send,) = psutil.Process(d.proc.pid).children()
            send.send_signal(signal.SIGTERM)
            if peer_pid:                 # strace ends once every process it follows has
                send.wait(timeout=60)
                with open(peer_pid) as f:
                    os.kill(int(f.read()), signal.SIGTERM)
            assert d.proc.wait(timeout=60) == 0
        finally:
            if peer_pid and d.proc.poll() is None and os.path.exists(peer_pid):
                with open(peer_pid) as f:          # in a session of its own: killpg misses it
                    try:
                        os.kill(int(f.read()), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if d.proc.poll() is None:
                os.killpg(d.proc.pid, signal.SIGKILL)
                d.proc.wait()
        rec = self._after_recording(trace, {})
        rec.acks = {tag: 0 for tag in self.spec}        # acknowledged before the run
        return rec

    def record_checkpoint_scenario(self, variant=None):
        """Record tests/checkpoint_scenario.py: checkpoints across a segment holding the
        FINISH of a message the previous checkpoint listed in flight; with a variant
        (tests/crash_variants.py) in qmail-send."""
        go = checkpoint_scenario.setup(self.users, self.base)
        for user in ("slow", "later"):
            self.maildirs["%s@test.example" % user] = os.path.join(self.users.base, user, "Maildir")
        if variant:
            crash_variants.install(self.home, "qmail-send", variant)
        self._before_recording()
        trace = cs.record([sys.executable, SCENARIO, self.home.path, self.base], self.base, env=self.home.env)
        checkpoint_scenario.release(go)
        with open(os.path.join(self.base, "scenario.json")) as f:
            facts = json.load(f)
        acked = {int(pid): tag for pid, tag in facts["acked"].items() if tag != "k"}  # K ends held
        self.held.add(str(facts["k"]))
        for tag in acked.values():
            self.spec[tag] = [checkpoint_scenario.SLOW if tag == "m" else checkpoint_scenario.FILLER]
        rec = self._after_recording(trace, acked)
        assert set(rec.acks) == set(self.spec), (rec.acks, acked)
        # qmail-send's recovery must never meet a live message whose FINISH is lost
        self.forbidden = re.compile(r"^warning: msg \d+: ended: ")
        return rec

    def record_reuse_scenario(self):
        """Record tests/reuse_scenario.py (directory backend): message a (to a@, queued
        before the run) ends, then message b (to b@) is queued; b is renumbered to a's
        number from its mess/ link on (cs.renumber). Returns the recording and a."""
        self.queue("a", [RCPTS[0]])
        (a,) = [int(name) for name in os.listdir(os.path.join(self.home.queue, "todo"))]
        self._before_recording()
        trace = cs.record([sys.executable, REUSE, self.home.path, self.base, str(a)], self.base,
                          env=self.home.env)
        with open(os.path.join(self.base, "scenario.json")) as f:
            acked = {int(pid): tag for pid, tag in json.load(f)["acked"].items()}
        self.spec["b"] = [RCPTS[1]]
        rec = self._after_recording(trace, acked)
        rec.acks["a"] = 0
        gone = body_removal(rec, a)
        taken = next(i for i, op in enumerate(rec.ops) if i > gone and op.kind in ("link", "rename")
                     and (op.dst or op.path).startswith("queue/mess/"))
        b = int((rec.ops[taken].dst or rec.ops[taken].path).rsplit("/", 1)[1])
        self.own_recipients = True
        return cs.renumber(rec, b, a, taken, SPLIT), a

    def pad_head(self, gap):
        """Log backend: queue messages (delivered after the crash, never checked) until
        the head segment ends `gap` bytes before a sector boundary, so that the next
        append starts there. Their sender's length sets the size of their ENVELOPE."""
        logdir = os.path.join(self.home.queue, "log")

        def head_size():
            segs = list_segments(logdir)
            return os.path.getsize(os.path.join(logdir, segment_name(segs[-1]))) if segs else 0

        def queue(sender):
            done = self.home.queue_message(message("pad"), sender, [RCPTS[0].encode()])
            assert done.returncode == 0, done.stderr
        queue(SENDER.encode())              # the first may make the segment (its header)
        before = head_size()
        queue(SENDER.encode())
        size = head_size()
        more = (cs.SECTOR - gap - size - (size - before)) % cs.SECTOR
        queue(b"p" * more + SENDER.encode())
        assert head_size() % cs.SECTOR == cs.SECTOR - gap, (before, size, head_size())

    def record_convert(self, to):
        """Record `qmailctl convert --to TO` of a stopped queue; an administrator whose
        conversion was cut off runs it again (qmailctl(8))."""
        argv = ["qmailctl", "convert", "--to", to, "--quiet"]
        self._before_recording()
        trace = cs.record(argv, self.base, env=self.home.env)
        rec = self._after_recording(trace, {})
        rec.acks = {tag: 0 for tag in self.spec}
        self.recovery = [argv]
        return rec

    # -- one crash state -------------------------------------------------------------
    def explore(self, rec, cap=None, regressions=(), posix_appends=cs.POSIX_APPENDS, only=None,
                always=None, single_keeps=False, prefixes=None, pair_drops=PAIRS, earlier_tears=FULL,
                first_failure=False):
        """Check every state (or `cap` of them, spread evenly over the protocol unless
        QMAILPY_TEST_CRASHSTATES_FULL=1, plus every state in which an operation that a regression
        names was lost, and every state always(rec, state) accepts), of those
        only(rec, state) accepts; returns (explored, distinct, failures). single_keeps:
        also every "one unsynced kept" state (cs.states), each one explored. prefixes:
        only the states at those prefixes. pair_drops, earlier_tears: as cs.states
        (by default what the knobs say). first_failure: stop at the first failing state
        (a known-bad variant's states fail slowly, each waiting out its deliveries)."""
        found = cs.states(rec, posix_appends=posix_appends, single_keeps=single_keeps,
                          pair_drops=pair_drops, earlier_tears=earlier_tears, prefixes=prefixes)
        if only is not None:
            found = [st for st in found if only(rec, st[0])]
        chosen = found
        if cap and not FULL and len(found) > cap:
            spread = {round(i * (len(found) - 1) / (cap - 1)) for i in range(cap)}
            chosen = [st for i, st in enumerate(found)
                      if i in spread or any(lost_op(rec, st[0], r) for r in regressions)
                      or (always is not None and always(rec, st[0]))
                      or st[0].how == "one unsynced kept"]
        kinds = {}
        for state, _ in chosen:
            kinds[state.how] = kinds.get(state.how, 0) + 1
        print("crash states by kind: %s" % ", ".join("%s %d" % k for k in sorted(kinds.items())))
        failures = []
        self.duplicates = {}            # recipient: states after which it holds a message twice
        explored, disks = 0, same_disks(rec, chosen)
        try:
            for group in disks:
                state, tree = group[-1]
                problem = self.check(rec, state, tree, len(group))
                explored += len(group)
                if problem:
                    # the state checked; the others' expectations are a subset of its own
                    same = "" if len(group) == 1 else " (the same disk as %d earlier states)" % (len(group) - 1)
                    failures.append("%s%s\n    %s" % (state.describe(rec), same, problem))
                    if first_failure:
                        return explored, len(found), failures
        finally:
            self.close()
        print("crash states checked: %d on %d disks" % (explored, len(disks)))
        return explored, len(found), failures

    def recovery_env(self):
        """The home's environment for the recovery's daemons. Without a peer no state has
        a remote delivery to make: qmail-rspawn runs as with $QMAILREMOTE (the home's own
        qmail-remote, exec'd per delivery as qmail does) rather than preloading its
        delivery workers' modules (dns, dkim, ssl: 0.2 s of CPU at each start, a third
        of a state's recovery). The states with a peer keep the workers."""
        if self.peer_sock is not None:
            return self.home.env
        return dict(self.home.env, QMAILREMOTE=os.path.join(self.home.path, "bin", "qmail-remote"))

    def check(self, rec, state, tree, states=1):
        """Materialise a state, recover it, check it: what is wrong, or None. states: how
        many chosen states have this disk (same_disks), for self.duplicates."""
        # The directories stay from the state before (cs.materialise keep_dirs): the same
        # disk, without removing and making a queue's hundred-odd directories each time.
        cs.materialise(tree, self.roots, self.owner_of, keep_dirs=True)
        expected = {tag: self.spec[tag] for tag, at in rec.acks.items() if at <= state.prefix}
        from_previous_boot(self.home.queue)
        # After a boot nothing orders qmail-queue (cron, an SMTP socket unit) after
        # qmail-send or the administrator: a message arrives first.
        done = queue_retrying(self.home, message(AFTER), SENDER.encode(), [RCPTS[0].encode()])
        if done.returncode != 0:
            return "qmail-queue after the crash exited %d: %s" % (done.returncode, done.stderr[-300:])
        expected[AFTER] = [RCPTS[0]]
        for argv in self.recovery:
            ran = subprocess.run(argv, env=self.home.env, capture_output=True)
            if ran.returncode != 0:
                return "%s exited %d: %s" % (" ".join(argv), ran.returncode, ran.stderr[-500:])
        log = os.path.join(self.base, "work", "send.log")
        if os.path.exists(log):
            os.unlink(log)
        orphans = orphan_files(self.home.queue)
        self.start_peer()
        d = Daemons(self.home, env=self.recovery_env())
        try:
            d.start()
            try:
                self.wait_delivered(expected)
                lines = d.wait_for(settled, 30, "every new msg ended")
                # qmail-send's cleanup walk removes what outlived its message (backends/dir/scan.py)
                lines = d.wait_for(lambda l: all(any("removed %s left over" % o in x for x in l)
                                                 for o in orphans), 30, "orphans %s removed" % orphans)
            except AssertionError as e:
                shutil.copy(d.logpath, os.path.join(self.base, "..", "crashstates-failed-send.log"))
                return "not delivered: %s\n    log: %s\n    maildirs: %s" % (
                    str(e)[:1500], d.lines(), {r: sorted(os.listdir(os.path.join(md, "new")))
                                                     for r, md in self.maildirs.items()})
            try:
                # What was in flight when the last expected copy arrived (a repeated
                # bounce, an end msg) finishes; what is stranded never does.
                d.wait_for(lambda l: settled(l) and not self.stranded(l), 30, "the queue drained")
            except AssertionError:
                pass
        finally:
            power_off(d)
        lines = d.lines()
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
        if self.own_recipients:
            problems.extend("%s got %s, a message not sent to it" % (r, tag)
                            for r, got in delivered.items() for tag in got
                            if tag in self.spec and r not in self.spec[tag])
        for r, got in self.copies().items():
            if any(n > 1 for n in got.values()):
                self.duplicates[r] = self.duplicates.get(r, 0) + states
        stuck = self.stranded(lines)
        if stuck:
            problems.append("left in the queue: %s" % stuck)
        # A body removed while its message was still referenced shows as a failed open.
        lost_bodies = [l for l in lines if "unable to open" in l or "No such file" in l]
        if lost_bodies:
            problems.append("bodies missing: %s" % lost_bodies[:3])
        if self.forbidden is not None:
            problems.extend("logged: %s" % l for l in lines if self.forbidden.match(l))
        warnings = [l for l in lines if re.match(r"^(warning|alert):", l)]
        if problems:
            shutil.copy(d.logpath, os.path.join(self.base, "..", "crashstates-failed-send.log"))
            return "; ".join(problems) + ("\n    log: %s" % warnings if warnings else "")
        return None

    def stranded(self, lines):
        """What the queue holds of messages qmail-send never ended. (It may be killed
        between "end msg" and its last bookkeeping, which a restart redoes.)"""
        ended = {l.split()[2] for l in lines if l.startswith("end msg ")} | self.held
        # command/: a qmailctl command whose caller the crash took leaves its reply
        # there (not a message; see qmail-send.md "Commands")
        return [x for x in leftovers(self.home)
                if not x.startswith(("mess/", "intd/", "log/", "command/")) and re.sub(r"\D+", " ", x).split()[-1:] != []
                and re.sub(r"\D+", " ", x).split()[-1] not in ended]

    def received(self):
        """{recipient: [(tag, data), ...]} of every message in the Maildirs."""
        out = {}
        for r, md in self.maildirs.items():
            got = out[r] = []
            for name in os.listdir(os.path.join(md, "new")):
                with open(os.path.join(md, "new", name), "rb") as f:
                    data = f.read()
                m = re.search(rb"^X-Crash-Id: (\S+)$", data, re.M)
                got.append((m.group(1).decode() if m else "?", data))
        return out

    def delivered(self):
        """{recipient: {tag: whole?}} from the Maildirs; a bounce counts for the tag of the
        message it returns, whole when it ends with that message."""
        out = {}
        for r, messages in self.received().items():
            got = out[r] = {}
            for tag, data in messages:
                got[tag] = got.get(tag, True) and data.endswith(message(tag))
        return out

    def copies(self):
        """{recipient: {tag: copies}} from the Maildirs."""
        out = {}
        for r, messages in self.received().items():
            got = out[r] = {}
            for tag, _ in messages:
                got[tag] = got.get(tag, 0) + 1
        return out

    def wait_delivered(self, expected, timeout=30):
        """Wait (inotify on each Maildir/new) until every expected recipient has its copy."""
        ino = INotify()
        for md in self.maildirs.values():
            ino.add_watch(os.path.join(md, "new"), flags.MOVED_TO | flags.CREATE)
        end = time.monotonic() + timeout
        while True:
            got = self.delivered()
            missing = [(t, r) for t, rs in expected.items() for r in rs if t not in got[r]]
            if not missing:
                return
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("missing deliveries %s" % missing)
            ino.read(timeout=int(min(left, 1.0) * 1000))


def wait_file(path, timeout=30):
    """Wait (inotify) until path exists: a pid file the peer renames into place once it listens."""
    deadline = time.monotonic() + timeout
    with INotify() as ino:
        ino.add_watch(os.path.dirname(path), flags.MOVED_TO | flags.CREATE)
        while not os.path.exists(path):
            left = deadline - time.monotonic()
            assert left > 0, "%s never appeared" % path
            ino.read(timeout=int(min(left, 1.0) * 1000))


def same_disks(rec, chosen):
    """The chosen states grouped by the disk they materialise to (Tree.key: names, hard
    links, contents, times, directories; materialise() writes a tree's files, modes and
    owners from these and the paths alone), in order of each disk's first state, each
    group in order of acknowledgements made by its state. cs.states keeps a tree again
    only when more was acknowledged by then: the group's last state expects a superset
    of what the others expect (every other check depends on the disk alone), so one
    recovery of the disk checked against it checks them all."""
    groups = {}
    for state, tree in chosen:
        groups.setdefault(tree.key(), []).append((state, tree))
    acked = lambda st: sum(1 for at in rec.acks.values() if at <= st[0].prefix)   # noqa: E731
    return [sorted(group, key=acked) for group in groups.values()]


def disk_image(roots, tree):
    """What a materialised state is, as the recovery sees it: {relative path: entry} of
    everything under the roots, each with its type, mode, owner; a file's contents (a
    digest), the first path of its hard links and its link count, and its times where
    the tree gives them (else they are the materialisation's: not compared)."""
    image, first = {}, {}
    for name, top in roots.items():
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for entry in [dirpath] + [os.path.join(dirpath, f) for f in sorted(filenames)]:
                rel = os.path.normpath(os.path.join(name, os.path.relpath(entry, top)))
                st = os.lstat(entry)
                kind = stat.S_IFMT(st.st_mode)
                item = [kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
                if stat.S_ISREG(st.st_mode):
                    with open(entry, "rb") as f:
                        item.append(hashlib.sha256(f.read()).hexdigest())
                    item += [first.setdefault(st.st_ino, rel), st.st_nlink]
                    times = tree.times.get(tree.names.get(rel))
                    if times:
                        item += [st.st_atime_ns, st.st_mtime_ns]
                image[rel] = tuple(item)
    return image


def lost_op(rec, state, regression):
    """True if the state lost an operation matching regression: (kind, path prefix)."""
    kind, prefix = regression
    return any(rec.ops[i].kind == kind and (rec.ops[i].path or "").startswith(prefix)
               for i in state.dropped)


# Crash states that found defects, always explored (tests/test_dirqueue_orphans.py):
# a bounce note's new file lost after its recipient was marked done (the bounce was
# never sent); a todo/ or channel file's removal lost after the message ended (left
# for good, or inherited by a new message with the same number).
DIR_SEND_REGRESSIONS = [("create", "queue/bounce/"), ("unlink", "queue/todo/"),
                        ("unlink", "queue/local/"), ("unlink", "queue/remote/"),
                        ("unlink", "queue/bounce/")]


def orphan_files(queue):
    """Directory backend: channel and bounce files whose message has neither info/ nor
    todo/, as a power cut may leave them (tests/test_dirqueue_orphans.py)."""
    def exists(kind, n):
        return os.path.exists(os.path.join(queue, relpath(kind, n)))
    found = []
    for kind in ("local", "remote", "bounce"):
        for dirpath, _, names in os.walk(os.path.join(queue, kind)):
            for name in names:
                if name.isdigit() and not any(exists(k, int(name)) for k in ("info", "todo")):
                    found.append(os.path.relpath(os.path.join(dirpath, name), queue))
    return found


def queue_retrying(home, data, sender, rcpts, tries=3):
    """qmail-queue, tried again after exit 64 (mess/ name taken), as a caller retries a
    temporary failure. A state rebuilt from the recording holds its files under new
    inode numbers, so now and then a new message's number is a name the state already
    has, which on the real disk the inode's own file would have kept from being handed
    out."""
    for _ in range(tries):
        done = home.queue_message(data, sender, rcpts)
        if done.returncode != 64:
            return done
    return done


def power_off(d):
    """SIGKILL qmail-start's whole session and wait (pidfd) until every process is gone:
    once settled, what is on disk is what counts."""
    fds = []
    for pid in descendants(d.proc.pid):
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    try:
        os.killpg(d.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for fd in fds:
        select.select([fd], [], [], 30)
        os.close(fd)
    d.proc.wait(timeout=30)             # gone by now: reaped at once


def descendants(pid):
    """pid and its descendants, from /proc/PID/task/TID/children (psutil's children()
    reads every process's stat on the machine, 25 ms a state here)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


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


def report(name, explored, distinct, failures):
    print("crash states explored: %s: %d of %d distinct, failing: %d" % (name, explored, distinct, len(failures)))
    assert not failures, "%d of %d crash states fail:\n%s" % (
        len(failures), explored, "\n".join(failures[:10]))


GROUP_COMMIT = [[("m1", RCPTS), ("m2", RCPTS), ("m3", RCPTS)], [("m4", RCPTS)]]


def queue_for_send_run(ex):
    ex.queue("m1", RCPTS)
    ex.queue("m2", [RCPTS[1]])
    ex.queue("m3", [RCPTS[0], NOUSER])


def a_hole_among_appends(rec, state):
    """One append of a snapshot's size (64 bytes or more: PREPROCESSED, REPLACEMENT, an
    ENVELOPE) lost while later appends to the same file were kept."""
    if len(state.dropped) != 1:
        return False
    (i,) = state.dropped
    op = rec.ops[i]
    return op.kind == "write" and op.append and len(op.data) >= 64 and any(
        later.kind == "write" and later.ino == op.ino for later in rec.ops[i + 1:state.prefix])


def peer_window(rec):
    """always() for explore(): a crash after the peer made a message durable (its sync of
    new/) and before the next sync of a file under queue/ (qmail-send's record of the
    delivery): for each prefix in that window, the state with every unsynced operation
    kept and the one with all of them lost."""
    queue_inodes = {op.ino for op in rec.ops if op.kind == "create" and op.path.startswith("queue/")}
    queue_inodes |= {ino for path, ino in cs.Tree.scan(rec.pre).names.items() if path.startswith("queue/")}
    windows = []
    for i, op in enumerate(rec.ops):
        if op.kind == "fsyncdir" and op.path.startswith("homes/farpeer/"):
            end = next((j for j in range(i + 1, len(rec.ops))
                        if rec.ops[j].kind == "fsync" and rec.ops[j].ino in queue_inodes), len(rec.ops))
            windows.append((i + 1, end))
    return lambda rec, state: state.how in ("prefix", "all unsynced lost") and any(
        a <= state.prefix <= b for a, b in windows)


def after_segment_unlinks(rec):
    """The prefixes right after each of a recording's unlinks of a log segment."""
    return [i + 1 for i, op in enumerate(rec.ops)
            if op.kind == "unlink" and re.match(r"queue/log/\d+\.seg$", op.path)]


def kept_or_all_lost(rec, state):
    """only() for explore(): every unsynced operation kept, or all of them lost."""
    return state.how in ("prefix", "all unsynced lost")


def lost_mkdir(path):
    """only() for explore(): the states that lost the mkdir of `path`."""
    return lambda rec, state: any(rec.ops[i].kind == "mkdir" and rec.ops[i].path == path
                                  for i in state.dropped)


NOT_BEFORE = 4102444800                  # 2100-01-01: a hold that no state may lose


def not_before_lost(rec, tree, state):
    """Acknowledged messages whose mess file in the tree lost its not-before mtime."""
    lost = []
    for tag, at in rec.acks.items():
        if at > state.prefix:
            continue
        marker = b"X-Crash-Id: %s\n" % tag.encode()
        found = [ino for path, ino in tree.names.items()
                 if path.startswith("queue/mess/") and marker in tree.contents.get(ino, b"")]
        if not found:
            lost.append("%s: no mess file" % tag)
        elif any((tree.times.get(ino) or (0, 0))[1] != NOT_BEFORE * 10 ** 9 for ino in found):
            lost.append("%s: mtime %s" % (tag, [tree.times.get(ino) for ino in found]))
    return lost


# Untraced calls qmailpy makes (crashstates.UNTRACED_CALLS), each with why no recorded
# protocol depends on it. A new one fails test_no_untraced_calls_unknown: trace it in
# crashstates.parse(), or say here why the explorer need not see it.
UNTRACED_KNOWN = {
    ("qmailpy/hierarchy.py", "os.mkfifo"): "qmailctl init makes lock/trigger; states keep a root's fifos as before the run",
    ("qmailpy/ctl/launchers.py", "os.symlink"): "qmailctl's launchers and man links, outside every root",
    ("qmailpy/queue/spool.py", "O_TMPFILE"): "a nameless scratch file for a message being received, never linked into a root",
}


# -- each dimension of the model with a known-bad variant only it catches -------------
def of_kind(*hows):
    """only() for explore(): the states made the ways named (cs.State.how)."""
    return lambda rec, state: state.how in hows


def variant_homes(base, backend, programs):
    """make(variant) -> an Explorer on a home of its own under base, whose `programs` run
    the variant (tests/crash_variants.py); make(None): the real code."""
    def make(variant):
        path = os.path.join(base, variant or "real")
        os.mkdir(path)
        ex = Explorer(path, backend)
        for program in programs if variant else ():
            crash_variants.install(ex.home, program, variant)
        return ex
    return make


def compare(name, make, record, cap=None, **explore):
    """Record (record(ex) -> Recording) and explore the same protocol on the real code and
    on the variant `name`, up to its first failing state (cap: as explore's): {None:
    (explored, distinct, failures), name: ...}."""
    results = {}
    for variant in (None, name):
        ex = make(variant)
        results[variant] = ex.explore(record(ex), cap, first_failure=variant is not None, **explore)
    print("crash states explored: %s: real code %d of %d (failing %d), variant %d of %d (failing %d)"
          % ((name,) + results[None][:2] + (len(results[None][2]),) + results[name][:2] + (len(results[name][2]),)))
    return results


HEADER_GAP = 5                          # bytes of the append before its first sector boundary


def segment_inodes(rec):
    """The inodes of the log's segments, before the recording or made in it."""
    names = list(cs.Tree.scan(rec.pre).names.items())
    names += [(op.path, op.ino) for op in rec.ops if op.kind == "create"]
    return {ino for path, ino in names if re.match(r"queue/log/\d+\.seg$", path)}


def appended_behind(rec, state):
    """only() for explore(): an append to a log segment torn at its half while a later
    append to the same segment was kept (an earlier unsynced write torn)."""
    if state.how != "earlier unsynced write torn":
        return False
    (i,) = state.torn
    op = rec.ops[i]
    return op.append and op.ino in segment_inodes(rec) and any(
        later.kind == "write" and later.ino == op.ino for later in rec.ops[i + 1:state.prefix])


def a_snapshot_torn_under_its_replacement(rec, state):
    """only() for explore(): a snapshot record (PREPROCESSED or REPLACEMENT) torn while
    a later REPLACEMENT of the same message, naming it as its prev, was kept."""
    if not appended_behind(rec, state):
        return False
    (i,) = state.torn
    op = rec.ops[i]
    torn = R.decode_one(op.data, 0)
    if torn is None or torn.type not in R.SNAPSHOTS:
        return False
    for j in range(i + 1, state.prefix):
        later = rec.ops[j]
        if later.kind == "write" and later.ino == op.ino and j not in state.dropped:
            records, _, _ = R.decode(later.data, 0, 0)
            if any(r.type == R.REPLACEMENT and r.n == torn.n and r.fields["prev"][1] == op.off
                   for r in records):
                return True
    return False


def the_body_removal_kept(rec, state):
    """only() for explore(): one unsynced operation kept, and it is a body's unlink."""
    if state.how != "one unsynced kept":
        return False
    kept = set(cs.not_durable(rec.ops, state.prefix)) - state.dropped
    return [(rec.ops[i].kind, rec.ops[i].path.split("/")[1]) for i in kept] == [("unlink", "mess")]


def a_removal_lost_under_a_new_message(a, lost, kept):
    """only() for explore(): after a new message took number a (its mess/S/a link after a's
    unlink there, both kept), a state that lost an unsynced removal of one of a's files
    of the kinds `lost` and none of the kinds `kept` (info, local, remote, bounce, todo,
    intd, hold)."""
    body = "queue/mess/%d/%d" % (a % SPLIT, a)

    def of(kinds):
        return re.compile(r"^queue/(%s)/(\d+/)?%d$" % ("|".join(kinds), a))
    lost_kind, kept_kind = of(lost), of(kept)

    def only(rec, state):
        gone = body_removal(rec, a)
        taken = next(i for i, op in enumerate(rec.ops)
                     if i > gone and op.kind in ("link", "rename") and (op.dst or op.path) == body)
        removals = [rec.ops[i].path for i in state.dropped if i < taken and rec.ops[i].kind == "unlink"]
        # the number is free for a new message only once the old body's unlink is done
        return state.prefix > taken and not {gone, taken} & state.dropped and any(
            lost_kind.match(p) for p in removals) and not any(kept_kind.match(p) for p in removals)
    return only


def body_removal(rec, n):
    """The index of the unlink of msg n's mess file."""
    body = "queue/mess/%d/%d" % (n % SPLIT, n)
    return next(i for i, op in enumerate(rec.ops) if op.kind == "unlink" and op.path == body)


LEFTOVERS = ("local", "remote", "bounce", "intd", "hold")     # what a new message may meet
ENDED = ("info", "todo")                # what says whether a message has ended


