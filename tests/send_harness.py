"""Running qmail-start on a test home and watching qmail-send's log (for the test_send_*,
test_delivery_* and test_crash_* files).

Daemons(home, workdir) starts `qmail-start DEFAULTDELIVERY` with its stdout (qmail-send's
log) in a file, waits on that file with inotify, and stops everything at the end. With
fake=True, small spawner programs written here stand in for qmail-lspawn and qmail-rspawn:
they answer by the recipient's local part (see FAKE_SPAWNER) and append every command
they get to workdir/commands. run_send_alone(home): qmail-send run with no spawners
(its fds 2 and 4 at EOF) and its log on a pipe: its exit code and log.

Opt-in audit collection: with QMAILPY_TEST_AUDIT_COLLECT=DIR in the environment, each home run
under Daemons gets DIR/<name>/ holding send.log (qmail-send's log, every line prefixed
with the epoch time a follower thread saw it appear, since the raw log has no times),
queue.snapshot (`qmailctl snapshot --host <name>` of the home, taken once the daemons
are gone) and meta.json. <name> is unique per home: audit each directory as host <name>
(message numbers are inodes, reused across homes). Collection happens in stop() and
kill(); the last one wins. Without the variable nothing of this runs.
"""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
from inotify_simple import INotify, flags

from knobs import AUDIT_COLLECT_ENV
from qmailpy import logline

FAKE_SPAWNER = r'''#!%(python)s
import os, sys, traceback
sys.path[:0] = %(path)r
def report_crash(*info):
    with open(os.path.join(%(work)r, "spawner-errors"), "a") as f:
        traceback.print_exception(*info, file=f)
sys.excepthook = report_crash
from qmailpy.spawn import CommandReader, encode_reply
os.write(1, bytes((120,)))
reader = CommandReader()
record = os.open(%(record)r, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
while True:
    data = os.read(0, 4096)
    if not data:
        break
    for c in reader.feed(data):
        os.write(record, b"%%d %%s %%s %%s\n" %% (c.slot, c.messid, c.sender or b"-", c.recipient))
        with open(os.path.join(os.environ["QMAILHOME"], "queue", "mess", c.messid.decode()), "rb") as f:
            copy = f.read()
        name = "msg-%%s-%%s" %% (c.messid.decode().replace("/", "_"), c.recipient.decode("latin-1"))
        fd = os.open(os.path.join(%(work)r, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, copy)
        os.close(fd)
        local = c.recipient.rsplit(b"@", 1)[0]
        if local.startswith(b"defer") or b"-defer" in local:
            report = b"Zdeferred by the fake spawner\n"
        elif local.startswith(b"fail") or b"-fail" in local:
            report = b"Dfailed by the fake spawner\nsecond line\n"
        elif local.startswith(b"mangle") or b"-mangle" in local:
            report = b"?what is this"
        else:
            report = b"Kdid 1+0+0\n"
        os.write(1, encode_reply(c.slot, report))
'''


def shared_dir(home, name):
    """A directory next to the home that the home's user can traverse and write."""
    path = os.path.join(os.path.dirname(home.path), name)
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)
    return path


def write_fake_spawners(home):
    """fakebin/qmail-lspawn and qmail-rspawn; returns (bindir, commands file)."""
    bindir = shared_dir(home, "fakebin")
    os.chmod(bindir, 0o755)
    record = os.path.join(shared_dir(home, "work"), "commands")
    for path in (record, os.path.join(os.path.dirname(record), "spawner-errors")):
        open(path, "ab").close()                # both spawners (root and the home's user) append
        os.chmod(path, 0o666)
    import qmailpy
    source = FAKE_SPAWNER % {"python": sys.executable, "record": record,
                             "work": os.path.dirname(record),
                             "path": [os.path.dirname(os.path.dirname(qmailpy.__file__))]}
    for name in ("qmail-lspawn", "qmail-rspawn"):
        path = os.path.join(bindir, name)
        with open(path, "w") as f:
            f.write(source)
        os.chmod(path, 0o755)
    return bindir, record


class Daemons:
    def __init__(self, home, fake=False, defaultdelivery="./Maildir/", env=None):
        self.home = home
        self.env = dict(env or home.env)
        self.commands = None
        if fake:
            bindir, self.commands = write_fake_spawners(home)
            self.env["PATH"] = bindir + os.pathsep + self.env["PATH"]
        self.defaultdelivery = defaultdelivery
        self.logpath = os.path.join(shared_dir(home, "work"), "send.log")
        self.proc = None
        self._inotify = None
        self.fake = fake
        self._audit = AuditCollector(self) if os.environ.get(AUDIT_COLLECT_ENV) else None

    # -- processes -------------------------------------------------------------
    def start(self):
        self.offset_of_start = self.line_count() if os.path.exists(self.logpath) else 0
        if self._audit is not None:
            self._audit.follow()
        with open(self.logpath, "ab") as log:
            self.proc = subprocess.Popen(["qmail-start", self.defaultdelivery], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=self.env, cwd="/",
                                         start_new_session=True)
        return self

    def wait_started(self, timeout=30):
        """Wait for this start's first status line."""
        start = self.offset_of_start
        return self.wait_for(lambda l: any(x.startswith("status: local") for x in l[start:]),
                             timeout, "startup status line")

    def daemons(self):
        """{program name: psutil.Process} of qmail-send and its children."""
        found = {}
        try:
            send = psutil.Process(self.proc.pid)
            procs = [send] + send.children()
        except psutil.NoSuchProcess:
            return found
        for proc in procs:
            try:
                cmd = proc.cmdline()
            except psutil.NoSuchProcess:
                continue
            for part in cmd[:3]:          # [python, -IS, HOME/bin/qmail-send] from a launcher
                name = os.path.basename(part)
                if name.startswith("qmail-"):
                    found[name] = proc
                    break
        return found

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def stop(self, timeout=60):
        """SIGTERM and wait for qmail-send and its helpers; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        helpers = list(self.daemons().values())
        self.signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        psutil.wait_procs(helpers, timeout=timeout)
        if self._audit is not None:
            self._audit.collect("stop")
        return code

    def kill(self):
        """SIGKILL every daemon (teardown)."""
        if self.proc is None:
            return
        procs = list(self.daemons().values())
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        if self._audit is not None:
            self._audit.collect("kill")

    # -- the log ---------------------------------------------------------------
    def lines(self):
        with open(self.logpath, "rb") as f:
            return [line.decode("utf-8", "surrogateescape") for line in f.read().split(b"\n")[:-1]]

    def line_count(self):
        return len(self.lines())

    def events(self, since=0):
        return [logline.parse(line) for line in self.lines()[since:]]

    def wait_for(self, predicate, timeout=30, what="log condition"):
        """Wait (inotify on the log file) until predicate(lines) is true; returns the lines."""
        if self._inotify is None:
            self._inotify = INotify()
            self._inotify.add_watch(self.logpath, flags.MODIFY)
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines()
            if predicate(lines):
                return lines
            left = deadline - time.monotonic()
            if self.proc is not None and self.proc.poll() is not None:
                lines = self.lines()
                if predicate(lines):
                    return lines
                left = 0                    # qmail-send is gone: nothing more will come
            if left <= 0:
                raise AssertionError("timed out waiting for %s; log:\n%s%s" % (
                    what, "\n".join(lines[-40:]), self._spawner_errors()))
            self._inotify.read(timeout=int(min(left, 1.0) * 1000))

    def _spawner_errors(self):
        try:
            with open(os.path.join(os.path.dirname(self.logpath), "spawner-errors")) as f:
                errors = f.read()
            return "\nfake spawner errors:\n" + errors if errors else ""
        except OSError:
            return ""

    def wait_line(self, pattern, count=1, timeout=30):
        regex = re.compile(pattern)
        return self.wait_for(lambda lines: sum(1 for l in lines if regex.search(l)) >= count,
                             timeout, "%d x %r" % (count, pattern))

    def wait_idle(self, n_end, timeout=60):
        """Wait until n_end 'end msg' lines are in the log."""
        return self.wait_line(r"^end msg ", n_end, timeout)


class AuditCollector:
    """QMAILPY_TEST_AUDIT_COLLECT=DIR: the stamped log and a queue snapshot of one home, for
    qmail-audit (see the module docstring). Only Daemons creates it, only with the variable."""

    def __init__(self, daemons):
        self.daemons = daemons
        home = os.path.realpath(daemons.home.path)
        self.name = "%s-%s" % (re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(os.path.dirname(home))),
                               hashlib.sha1(home.encode()).hexdigest()[:10])
        self.dir = os.path.join(os.environ[AUDIT_COLLECT_ENV], self.name)   # made by follow()
        self.stamped = os.path.join(self.dir, "send.log")
        self.test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        self.thread = None
        self.stopping = threading.Event()
        self.errors = []
        self.collections = 0

    def follow(self):
        """Start copying the lines qmail-send appends from now on, each with its time."""
        self.finish()
        os.makedirs(self.dir, exist_ok=True)
        offset = os.path.getsize(self.daemons.logpath) if os.path.exists(self.daemons.logpath) else 0
        open(self.daemons.logpath, "ab").close()
        self.stopping.clear()
        self.thread = threading.Thread(target=self._follow, args=(offset,), daemon=True)
        self.thread.start()

    def _follow(self, offset):
        pending = b""
        try:
            with INotify() as ino, open(self.daemons.logpath, "rb") as src, \
                    open(self.stamped, "ab") as out:
                ino.add_watch(self.daemons.logpath, flags.MODIFY)
                src.seek(offset)
                while True:
                    last = self.stopping.is_set()       # read once more after the stop
                    data = src.read()
                    if data:
                        now = time.time()
                        pending += data
                        *lines, pending = pending.split(b"\n")
                        out.write(b"".join(b"%.6f %s\n" % (now, line) for line in lines))
                        out.flush()
                    if last:
                        break
                    ino.read(timeout=200)
            if pending:
                self.errors.append("unterminated last line %r" % pending[:200])
        except Exception as e:                                  # reported by collect()
            self.errors.append("log follower: %r" % e)

    def finish(self):
        if self.thread is not None:
            self.stopping.set()
            self.thread.join(timeout=30)
            if self.thread.is_alive():
                self.errors.append("log follower did not stop")
            self.thread = None

    def collect(self, how):
        """After the daemons are gone: finish the log copy, snapshot the queue (last wins)."""
        self.finish()
        self.collections += 1
        home = self.daemons.home
        snap = os.path.join(self.dir, "queue.snapshot")
        done = subprocess.run(["qmailctl", "snapshot", "--home", home.path, "--out", snap,
                               "--host", self.name], env=self.daemons.env,
                              capture_output=True, timeout=120)
        if done.returncode != 0:
            self.errors.append("qmailctl snapshot: exit %d: %s" % (
                done.returncode, done.stderr.decode(errors="replace")[-2000:]))
        meta = {"host": self.name, "home": home.path, "test": self.test, "how": how,
                "fake": self.daemons.fake, "backend": getattr(home, "backend", None),
                "collections": self.collections, "errors": self.errors}
        tmp = os.path.join(self.dir, "meta.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1)
        os.rename(tmp, os.path.join(self.dir, "meta.json"))


def wait_gone(path, timeout=30):
    """Wait (inotify on its directory) until path no longer exists."""
    with INotify() as ino:
        ino.add_watch(os.path.dirname(path), flags.DELETE | flags.MOVED_FROM)
        deadline = time.monotonic() + timeout
        while os.path.exists(path):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("%s still exists after %d s" % (path, timeout))
            ino.read(timeout=int(min(left, 1.0) * 1000))


def wait_mess_gone(home, n, timeout=30):
    """qmail-send logs 'end msg' before qmail-clean removes mess/S/n: wait for the removal."""
    wait_gone(os.path.join(home.queue, "mess", str(n % 23), str(n)), timeout)


def wait_exit(proc, timeout=30):
    return proc.wait(timeout=timeout)


def run_send_alone(home):
    """qmail-send with its log on a pipe and fds 2/4 at EOF (no spawners): (exit code, log)."""
    log_r, log_w = os.pipe()
    ends = [os.pipe() for _ in range(2)]
    for r, w in ends:
        os.close(w)

    def wire():
        os.dup2(ends[1][0], 4)
    try:
        proc = subprocess.run(["qmail-send"], stdin=log_w, stdout=subprocess.DEVNULL, stderr=ends[0][0],
                              env=home.env, timeout=60, preexec_fn=wire)
        os.close(log_w)
        log_w = None
        return proc.returncode, os.read(log_r, 4096)
    finally:
        for fd in (log_r, log_w, ends[0][0], ends[1][0]):
            if fd is not None:
                os.close(fd)
