"""qmail's real accounts, for the tests that check who may do what (root only).

ensure_accounts() creates, when missing, the groups qmail, nofiles and qmaillog and the
accounts of qmail's INSTALL.ids (alias, qmaild, qmaill, qmailp with group nofiles;
qmailq, qmailr, qmails with group qmail), no home, no shell, plus two ordinary
users: `qtuser` and `qtweb` (a web server's account, as www-data is). They stay
on the machine: creating them again is a no-op.

multiuser_home(base, backend) is a home made by `qmailctl init` as root without
--user, so every role runs as its own account, as on a real server.
"""
import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import tempfile

from conftest import QmailHome, VENV_BIN

QMAIL_GROUPS = ("qmail", "nofiles", "qmaillog")
QMAIL_USERS = (("alias", "nofiles"), ("qmaild", "nofiles"), ("qmaill", "nofiles"),
               ("qmailp", "nofiles"), ("qmailq", "qmail"), ("qmailr", "qmail"),
               ("qmails", "qmail"))
ORDINARY = ("qtuser", "qtweb")


def _exists(getter, name):
    try:
        getter(name)
        return True
    except KeyError:
        return False


def ensure_accounts():
    # Test processes run side by side (pytest-xdist): one creates, the others wait and see them.
    with open("/run/qmailpy-test-accounts.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _create_missing()


def _create_missing():
    for group in QMAIL_GROUPS:
        if not _exists(grp.getgrnam, group):
            subprocess.run(["groupadd", "--system", group], check=True)
    for user, group in QMAIL_USERS:
        if not _exists(pwd.getpwnam, user):
            subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", "--gid", group, user], check=True)
    for user in ORDINARY:
        if not _exists(pwd.getpwnam, user):
            subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/bin/sh", "--user-group", user], check=True)


def uid(name):
    return pwd.getpwnam(name).pw_uid


def gid(name):
    return grp.getgrnam(name).gr_gid


@contextlib.contextmanager
def temporary_multiuser_home(backend="dir"):
    """ensure_accounts(), then a multiuser_home in a fresh traversable directory, removed after."""
    ensure_accounts()
    base = tempfile.mkdtemp(prefix="qmailpy-accounts-")
    os.chmod(base, 0o755)
    try:
        yield multiuser_home(base, backend)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def multiuser_home(base, backend="dir"):
    path = os.path.join(base, "home")
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("QMAILHOME", None)
    done = subprocess.run(["qmailctl", "init", "--home", path, "--me", "test.example"],
                          env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    home = QmailHome(path, "root")         # control files belong to root, as on a server
    home.backend = backend
    if backend != "dir":
        home.control("queuebackend", backend + "\n")
    check = subprocess.run(["qmailctl", "check", "--home", path], env=home.env,
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    return home
