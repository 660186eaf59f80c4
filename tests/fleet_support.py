"""A fleet of qmailpy homes on this machine for the fleet audit's tests (tests/test_audit_fleet.py):
each home made by `qmailctl init`, its SMTP listener on its own loopback address 127.0.1.x,
mail between them routed by control/smtproutes.
"""
import datetime
import os
import re
import shutil
import socket
import tempfile
import time

from inotify_simple import INotify, flags

from conftest import make_home
from ctl_support import ctl
from qmailpy.logfiles import QMQPD_LOG, SEND_LOG

TIMEOUT = 60


def free_port(address):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class FleetHost:
    """A home named `name` whose qmail-smtpd listens on address:port (once started)."""

    def __init__(self, name, address):
        self.name, self.address = name, address
        self.base = traversable_base_dir()
        self.home = make_home(self.base)
        self.port = free_port(address)
        self.qmqp_port = free_port(address)
        self.log = os.path.join(self.home.path, "log", SEND_LOG)
        self.qmqpd_log = os.path.join(self.home.path, "log", QMQPD_LOG)

    def routes(self, text):
        self.home.control("smtproutes", text)

    def accept_for(self, *domains):
        self.home.control("rcpthosts", "".join(d + "\n" for d in ("test.example",) + domains))

    def start(self, smtp=True, qmqp=False):
        """qmailctl start; with qmqp, qmail-qmqpd also answers QMQP on address:qmqp_port."""
        args = ["start"] + (["--smtp", "%s:%d" % (self.address, self.port)] if smtp else [])
        if qmqp:
            args += ["--qmqp", "%s:%d" % (self.address, self.qmqp_port)]
        done = ctl(self.home, *args)
        assert done.returncode == 0, done.stderr

    def stop(self):
        done = ctl(self.home, "stop")
        assert done.returncode == 0, done.stderr
        self.wait_log(lambda text: "status: exiting" in text)

    def wait_log(self, predicate, timeout=TIMEOUT):
        """Until predicate(qmail-send's log text) holds: woken by inotify on the log's
        directory (the file may not exist yet, and rotation makes a new one)."""
        with INotify() as watch:
            watch.add_watch(os.path.dirname(self.log), flags.CREATE | flags.MODIFY | flags.MOVED_TO)
            deadline = time.monotonic() + timeout
            while not predicate(self.log_text()):
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting on %s" % self.log
                watch.read(timeout=int(min(left, 1.0) * 1000))

    def log_text(self):
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def remove(self):
        shutil.rmtree(self.base, ignore_errors=True)


def make_null_client(base, *hubs):
    """A mini-qmail home (qmailctl init --mini HUB...): no queue, no log; its path."""
    import subprocess
    from conftest import VENV_BIN
    path = os.path.join(base, "mini")
    done = subprocess.run([os.path.join(VENV_BIN, "qmailctl"), "init", "--home", path, "--me",
                           "mini.example", "--mini", *hubs], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return path


def null_client_sendmail(mini, message, sender, recipient):
    """The null client's sendmail, as cron runs it: its qmail-queue is qmail-qmqpc."""
    import subprocess
    env = {"PATH": "/usr/bin:/bin", "QMAILHOME": mini, "LOGNAME": "root", "HOME": "/"}
    done = subprocess.run([os.path.join(mini, "bin", "sendmail"), "-f", sender, recipient],
                          input=message, capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done


def wait_file(path, timeout=TIMEOUT):
    """Until path exists: woken by inotify on its directory."""
    with INotify() as watch:
        watch.add_watch(os.path.dirname(path), flags.CREATE | flags.MOVED_TO)
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            left = deadline - time.monotonic()
            assert left > 0, "timed out waiting for %s" % path
            watch.read(timeout=int(min(left, 1.0) * 1000))


def kill_home(home_path, required=True):
    """SIGKILL every process whose QMAILHOME is home_path (the daemons qmailctl started, their
    children, what they run), as a machine that loses power; wait until all are gone."""
    import psutil
    home_path = os.path.abspath(home_path)
    victims = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("QMAILHOME") == home_path:
                proc.kill()
                victims.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert victims or not required, "no process of %s" % home_path
    _gone, alive = psutil.wait_procs(victims, timeout=TIMEOUT)
    assert not alive, alive


def traversable_base_dir():
    base = tempfile.mkdtemp(prefix="qmailpy-fleet-")
    os.chmod(base, 0o755)
    return base


def remove_queued(home):
    """Every message file below HOME/queue, removed behind qmail-send's back; the paths."""
    gone = []
    for sub in ("mess", "todo", "intd", "info", "local", "remote", "bounce"):
        for dirpath, _dirs, files in os.walk(os.path.join(home.queue, sub)):
            for name in files:
                if name.isdigit():
                    os.unlink(os.path.join(dirpath, name))
                    gone.append(os.path.join(dirpath, name))
    return gone


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6})Z")


def shifted_log(src, dst, seconds):
    """A copy of qmail-send's stamped log with every time moved by `seconds`."""
    def shift(m):
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
        return (t + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            new, count = _STAMP.subn(shift, line)
            assert count == 1, line
            out.write(new)
