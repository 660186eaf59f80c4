"""Shared fixtures: a real qmail home in a temp directory.

qmail_home: a fresh home made by `qmailctl init --home PATH --me test.example
--user USER`. USER is the invoking user, or `nobody` when the tests run as
root; then the home lives under a 0755 directory (pytest's own temp base is
0700 for root, which nobody could not traverse) and is owned by nobody.

queue_backend: the backend qmail_home writes to control/queuebackend. It is
"dir" unless the test is marked `both_backends` (then it runs once per
backend, ids [dir] and [log]); tests marked `dir_only` inspect the directory
backend's own files (todo/, intd/, info/, local/, remote/...) and stay on it.
A module opts in wholesale with `pytestmark = pytest.mark.both_backends`.

QMAILPY_TEST_KEEP_HOMES=1 keeps every home (as root the directory is otherwise removed at
teardown) and prints its path, to read a failed run's queue and logs afterwards.
"""
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

import knobs

VENV_BIN = os.path.dirname(sys.executable)
AS_ROOT = os.geteuid() == 0
# Spark's defaults for every JVM the tests start (tests/spark-conf/spark-defaults.conf)
os.environ["SPARK_CONF_DIR"] = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "spark-conf")


class QmailHome:
    """A qmail home under test (see the module docstring)."""

    def __init__(self, path, user):
        pw = pwd.getpwnam(user)
        self.path = path
        self.queue = os.path.join(path, "queue")
        self.user, self.uid, self.gid = user, pw.pw_uid, pw.pw_gid
        env = dict(os.environ)
        env.pop("QMAILQUEUE", None)
        env["QMAILHOME"] = path
        # HOME/bin first: the launchers `qmailctl init` wrote, started without site
        env["PATH"] = os.pathsep.join((os.path.join(path, "bin"), VENV_BIN, env.get("PATH", "/usr/bin:/bin")))
        self.env = env

    def control(self, name, text):
        """Write control/NAME (str or bytes), owned like the rest of the home."""
        path = os.path.join(self.path, "control", name)
        with open(path, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
        os.chmod(path, 0o644)
        if AS_ROOT:
            os.chown(path, self.uid, self.gid)
        return path

    def run(self, argv, input=None, **kw):
        """subprocess.run with this home's environment; output captured unless told otherwise."""
        kw.setdefault("env", self.env)
        if "stdout" not in kw and "stderr" not in kw and "capture_output" not in kw:
            kw["capture_output"] = True
        kw.setdefault("timeout", 60)
        return subprocess.run(argv, input=input, **kw)

    def queue_message(self, message, sender, recipients, env=None):
        """Run qmail-queue: message on fd 0, envelope on fd 1 (both pipes); a CompletedProcess."""
        envelope = b"F" + sender + b"\0" + b"".join(b"T" + r + b"\0" for r in recipients) + b"\0"
        env_r, env_w = os.pipe()
        try:
            proc = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=env_r,
                                    stderr=subprocess.PIPE, env=env or self.env)
        finally:
            os.close(env_r)
        try:
            try:
                proc.stdin.write(message)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                with os.fdopen(env_w, "wb", closefd=True) as f:
                    env_w = None
                    f.write(envelope)
            except BrokenPipeError:
                pass
            stderr = proc.stderr.read()
            proc.stderr.close()
            code = proc.wait(timeout=60)
        finally:
            if env_w is not None:
                os.close(env_w)
        return subprocess.CompletedProcess(["qmail-queue"], code, b"", stderr)


def pytest_configure(config):
    config.addinivalue_line("markers", "both_backends: run once per queue backend (dir, log)")
    config.addinivalue_line("markers", "dir_only: inspects directory-backend files; never on log")
    config.addinivalue_line("markers", "slow: left out of bin/test --quick (docs/testing.md \"Two tiers\")")


# The longest test files, longest first (pytest --durations=0 of a whole run, summed per
# file): bin/test's processes (xdist --dist loadfile --no-loadscope-reorder) take files
# in collection order, so these start first and the short ones fill in around them, instead
# of one long file starting late and running on alone at the end.
LONGEST_FILES = ("test_audit.py", "test_audit_incremental.py", "test_crash_states_queue.py",
                 "test_audit_fleet.py", "test_crash_states_send.py", "test_logqueue_records.py",
                 "test_crash_states_dir_send.py", "test_crash_states.py", "test_audit_sql.py",
                 "test_audit_fleet_queue.py", "test_queue_commands.py",
                 "test_logqueue_doqueue.py", "test_callers.py")


def pytest_collection_modifyitems(items):
    # A Spark session takes tens of seconds to start: a test that asks for one (its
    # fixture is named spark) is slow whether or not its module says so.
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable


def pytest_generate_tests(metafunc):
    if "queue_backend" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("dir_only") is not None:
        return
    if metafunc.definition.get_closest_marker("both_backends") is not None:
        metafunc.parametrize("queue_backend", ["dir", "log"], indirect=True)


@pytest.fixture
def queue_backend(request):
    """"dir" or "log" (see the module docstring)."""
    return getattr(request, "param", "dir")


def make_home(base, backend="dir"):
    """A home at BASE/home made by `qmailctl init` (see the module docstring); BASE must
    be traversable by the home's user."""
    user = "nobody" if AS_ROOT else pwd.getpwuid(os.geteuid()).pw_name
    path = os.path.join(base, "home")
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(["qmailctl", "init", "--home", path, "--me", "test.example", "--user", user],
                          env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    home = QmailHome(path, user)
    home.backend = backend
    if backend != "dir":
        home.control("queuebackend", backend + "\n")
    return home


def traversable_base(tmp_path, prefix="qmailpy-test-"):
    """tmp_path, or as root a fresh 0755 directory that nobody can traverse."""
    if not AS_ROOT:
        return str(tmp_path)
    base = tempfile.mkdtemp(prefix=prefix)
    os.chmod(base, 0o755)
    return base


@pytest.fixture
def qmail_home(tmp_path, queue_backend):
    base = traversable_base(tmp_path)
    try:
        yield make_home(base, queue_backend)
    finally:
        if knobs.KEEP_HOMES:
            print("kept home:", base)
        elif AS_ROOT:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def users(qmail_home):
    """Local users in users/assign with their own homes (lspawn_harness.LocalUsers)."""
    from lspawn_harness import LocalUsers
    return LocalUsers(qmail_home)


@pytest.fixture
def daemons(qmail_home):
    """The real daemons under qmail-start (send_harness.Daemons), killed at teardown;
    test files with other needs (fake spawners, smtproutes) override it."""
    from send_harness import Daemons
    d = Daemons(qmail_home)
    yield d
    d.kill()
