"""qmailctl check on the files inside control/, users/ and log/ (see also
tests/test_layout.py): what a local user could rewrite or read is reported with its fix."""
import os
import shutil

import pytest

from conftest import AS_ROOT
from ctl_support import check


def test_a_symlinked_control_file_is_judged_by_its_target(qmail_home, tmp_path):
    target = os.path.join(qmail_home.path, "rcpthosts-elsewhere")
    with open(target, "w") as f:
        f.write("test.example\n")
    os.chmod(target, 0o666)                 # anyone could make this host an open relay
    link = os.path.join(qmail_home.path, "control", "rcpthosts")
    os.unlink(link)
    os.symlink(target, link)
    assert check(qmail_home) == (1, [
        "control/rcpthosts: mode 0666 is writable by group or others (fix: chmod go-w control/rcpthosts)"])
    os.chmod(target, 0o644)
    assert check(qmail_home) == (0, [])


def test_logs_writable_by_others_and_rotated_logs_are_reported(qmail_home):
    logdir = os.path.join(qmail_home.path, "log")
    os.makedirs(logdir, exist_ok=True)
    for name, mode in (("qmail-send.log", 0o620), ("qmail-send.@20260101T000000.000000Z.log", 0o604),
                       ("qmail-smtpd.log", 0o640), ("qmail-send.pid", 0o644)):
        path = os.path.join(logdir, name)
        open(path, "ab").close()
        os.chmod(path, mode)
    code, lines = check(qmail_home)
    assert code == 1
    assert sorted(lines) == [
        "log/qmail-send.@20260101T000000.000000Z.log: mode 0604 lets every local user read every "
        "envelope address (fix: chmod o-r log/qmail-send.@20260101T000000.000000Z.log)",
        "log/qmail-send.log: mode 0620 lets others forge or erase log lines "
        "(fix: chmod go-w log/qmail-send.log)"]


@pytest.mark.slow
def test_logs_qmailctl_start_writes_check_clean(qmail_home):
    done = qmail_home.run(["qmailctl", "start", "--home", qmail_home.path])
    try:
        assert done.returncode == 0, done.stderr
    finally:
        qmail_home.run(["qmailctl", "stop", "--home", qmail_home.path])
    logdir = os.path.join(qmail_home.path, "log")
    logs = sorted(n for n in os.listdir(logdir) if n.endswith(".log"))
    assert logs == ["qmail-qmqpd.log", "qmail-send.log"]
    assert {os.stat(os.path.join(logdir, n)).st_mode & 0o777 for n in logs} == {0o640}
    assert check(qmail_home) == (0, [])


@pytest.mark.slow
def test_the_log_backends_group_is_needed_only_on_the_log_backend(qmail_home):
    """A home of real qmail has no group qmaillog (nor queue/log): on the dir backend
    that is no problem; switched to the log backend it is."""
    roles = os.path.join(qmail_home.path, "control", "roles")
    with open(roles) as f:
        kept = [line for line in f if not line.startswith("qmaillog:")]
    qmail_home.control("roles", "".join(kept) + "qmaillog:no-such-group-qmailpy\n")
    os.rmdir(os.path.join(qmail_home.queue, "log"))
    assert check(qmail_home) == (0, [])
    qmail_home.control("queuebackend", "log\n")
    code, lines = check(qmail_home)
    assert code == 1
    assert "control/roles: group qmaillog: no such group: no-such-group-qmailpy" in lines, lines


@pytest.mark.slow
@pytest.mark.skipif(not AS_ROOT, reason="qmail's own accounts and a root-owned home need root")
def test_a_home_laid_out_as_real_qmails_is_faulted_only_for_run():
    """qmail's accounts, no control/roles, no bin/ launchers, no queue/log, no run/:
    what a home installed by qmail's own `make setup check` has."""
    from accounts import temporary_multiuser_home
    with temporary_multiuser_home("dir") as home:
        for name in ("run", "bin", os.path.join("queue", "log"), os.path.join("control", "roles")):
            path = os.path.join(home.path, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        assert check(home) == (1, ["run: missing (should be a directory)"])
