"""Smaller things an administrator meets (issue 25 point 4): convert --to log leaves queue/log
as layout.conf has it, check flags a world-readable private key, an ordinary user's queue
delete says permission denied, the oldest-message metric is right from qmail-send's start."""
import grp
import os
import pwd
import re
import stat
import subprocess

import pytest

from ctl_support import ctl
from qmailpy.send import metrics
from send_harness import Daemons

pytestmark = pytest.mark.slow

AS_ROOT = os.geteuid() == 0
# a home with qmail's accounts, played by distinct system accounts that exist on Debian
ROLES = {"alias": "news", "qmaild": "daemon", "qmaill": "sys", "qmailp": "games", "qmailq": "bin",
         "qmailr": "man", "qmails": "lp", "qmail": "mail", "nofiles": "nogroup", "qmaillog": "uucp"}
ORDINARY = "proxy"


def _accounts_exist():
    try:
        for role, name in ROLES.items():
            (grp.getgrnam if role in ("qmail", "nofiles", "qmaillog") else pwd.getpwnam)(name)
        pwd.getpwnam(ORDINARY)
    except KeyError:
        return False
    return True


@pytest.fixture
def accounts_home(qmail_home):
    """qmail_home turned into a home of several accounts (control/roles, then init as root)."""
    if not AS_ROOT:
        pytest.skip("needs root: a home of several accounts")
    if not _accounts_exist():
        pytest.skip("the system accounts that play qmail's are missing")
    with open(os.path.join(qmail_home.path, "control", "roles"), "w") as f:
        f.write("".join("%s:%s\n" % item for item in ROLES.items()))
    done = subprocess.run(["qmailctl", "init", "--home", qmail_home.path], env=qmail_home.env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    control = os.path.join(qmail_home.path, "control")
    for name in os.listdir(control):            # what the single-user home's user wrote
        os.chown(os.path.join(control, name), 0, grp.getgrnam("mail").gr_gid)
    return qmail_home


def test_convert_to_log_leaves_queue_log_as_the_layout_says(accounts_home):
    home = accounts_home
    assert home.queue_message(b"Subject: x\n\ny\n", b"a@test.example", [b"b@far.example"]).returncode == 0
    done = ctl(home, "convert", "--to", "log", "--quiet")
    assert done.returncode == 0, done.stderr.decode()
    logdir = os.path.join(home.queue, "log")
    st = os.stat(logdir)
    assert (st.st_uid, st.st_gid) == (pwd.getpwnam("bin").pw_uid, grp.getgrnam("uucp").gr_gid)
    assert stat.S_IMODE(st.st_mode) == 0o2770
    for name in os.listdir(logdir):
        st = os.lstat(os.path.join(logdir, name))
        assert (st.st_uid, st.st_gid) == (pwd.getpwnam("bin").pw_uid, grp.getgrnam("uucp").gr_gid), name
    check = ctl(home, "check")
    assert check.returncode == 0, check.stdout.decode()


def test_check_flags_a_private_key_every_local_user_can_read(qmail_home):
    path = qmail_home.control("servercert.pem", "-----BEGIN PRIVATE KEY-----\n")
    os.chmod(path, 0o644)
    check = ctl(qmail_home, "check")
    assert check.returncode == 1
    assert re.search(rb"^control/servercert.pem: mode 0644 lets every local user read the server's "
                     rb"private key \(fix: chgrp \S+ control/servercert.pem; chmod 0640 control/servercert.pem\)$",
                     check.stdout, re.M), check.stdout
    os.chmod(path, 0o640)
    check = ctl(qmail_home, "check")
    assert check.returncode == 0, check.stdout


def test_an_ordinary_users_queue_delete_says_permission_denied(accounts_home):
    done = subprocess.run(["qmailctl", "queue", "delete", "1", "--home", accounts_home.path],
                          env=accounts_home.env, capture_output=True, timeout=60, user=ORDINARY,
                          group=pwd.getpwnam(ORDINARY).pw_gid, extra_groups=[])
    err = done.stderr.decode()
    assert done.returncode == 1, (done.returncode, err)
    assert "Traceback" not in err and "qmailctl init makes it" not in err, err
    assert err == ("qmailctl queue delete: permission denied: only root and qmail-send's account may act "
                   "on the queue; nothing done\n"), err


@pytest.mark.both_backends
def test_the_oldest_message_age_is_right_at_qmail_sends_first_write(qmail_home):
    qmail_home.control("smtproutes", ":127.0.0.1:1\n")        # nothing listens: the message waits
    assert qmail_home.queue_message(b"Subject: x\n\ny\n", b"a@test.example", [b"b@far.example"]).returncode == 0
    mess = [os.path.join(where, name) for where, _, names in os.walk(os.path.join(qmail_home.queue, "mess"))
            for name in names]
    assert len(mess) == 1
    day_ago = os.stat(mess[0]).st_mtime - 86400
    os.utime(mess[0], (day_ago, day_ago))
    path = os.path.join(qmail_home.path, metrics.DIRECTORY, metrics.FILE)
    daemons = Daemons(qmail_home)
    try:
        daemons.start().wait_started()
        daemons.wait_for(lambda _: os.path.exists(path), 30, "qmail-send's first metrics file")
        with open(path) as f:
            values = metrics.parse(f.read())
    finally:
        daemons.kill()
    assert 86399 <= values["qmail_queue_oldest_message_age_seconds"] < 86400 + 600
