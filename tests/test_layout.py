"""qmailctl init creates the layout; qmailctl check finds every way it can be broken."""
import os
import pwd
import shutil
import stat

import pytest

from ctl_support import check
from qmailpy import hierarchy, privs
from qmailpy.ctl.init import default_domain, plus_domain

AS_ROOT = os.geteuid() == 0


@pytest.mark.slow
def test_init_then_check_is_clean(qmail_home):
    assert check(qmail_home) == (0, [])
    q = qmail_home.queue
    assert stat.S_ISFIFO(os.lstat(os.path.join(q, "lock/trigger")).st_mode)
    assert open(os.path.join(q, "lock/tcpto"), "rb").read() == b"\0" * 1024
    assert sorted(os.listdir(os.path.join(q, "mess")), key=int) == [str(s) for s in range(23)]
    for rel, mode in [("queue", 0o750), ("queue/pid", 0o700), ("queue/mess/7", 0o750), ("queue/intd", 0o700),
                      ("queue/todo", 0o750), ("queue/info/22", 0o700), ("queue/bounce", 0o700),
                      ("queue/lock/sendmutex", 0o600), ("queue/lock/trigger", 0o622), ("alias", 0o2755)]:
        st = os.lstat(os.path.join(qmail_home.path, rel))
        assert stat.S_IMODE(st.st_mode) == mode, rel
        assert st.st_uid == qmail_home.uid, rel


@pytest.mark.slow
def test_init_writes_controls_and_roles(qmail_home):
    control = os.path.join(qmail_home.path, "control")
    for name in ("me", "locals", "rcpthosts", "defaultdomain", "plusdomain"):
        assert open(os.path.join(control, name)).read() == "test.example\n"
    roles = privs.load_roles(qmail_home.path)
    assert privs.single_user(roles) == qmail_home.user
    assert privs.account(qmail_home.path, "qmailq").uid == qmail_home.uid


@pytest.mark.slow
def test_init_is_idempotent_and_keeps_controls(qmail_home):
    qmail_home.control("locals", "test.example\nother.example\n")
    assert qmail_home.queue_message(b"m\n", b"a@b", [b"c@d"]).returncode == 0
    got = qmail_home.run(["qmailctl", "init", "--home", qmail_home.path])
    assert got.returncode == 0, got.stderr
    assert open(os.path.join(qmail_home.path, "control", "locals")).read() == "test.example\nother.example\n"
    assert privs.single_user(privs.load_roles(qmail_home.path)) == qmail_home.user
    assert len(os.listdir(os.path.join(qmail_home.queue, "todo"))) == 1
    assert check(qmail_home) == (0, [])


@pytest.mark.slow
def test_check_lists_every_discrepancy(qmail_home):
    q = qmail_home.queue
    shutil.rmtree(os.path.join(q, "info", "5"))
    os.chmod(os.path.join(q, "todo"), 0o755)
    os.unlink(os.path.join(q, "lock", "trigger"))
    open(os.path.join(q, "lock", "trigger"), "w").close()
    with open(os.path.join(q, "lock", "tcpto"), "ab") as f:
        f.write(b"x")
    os.mkdir(os.path.join(q, "mess", "23"))
    os.unlink(os.path.join(qmail_home.path, "control", "me"))
    os.rmdir(os.path.join(q, "bounce"))
    code, lines = check(qmail_home)
    assert code == 1
    expected = {
        "queue/info/5: missing (should be a directory)",
        "queue/todo: mode 0755, should be 0750",
        "queue/lock/trigger: is not a named pipe",
        "queue/lock/tcpto: size 1025, should be 1024",
        "queue/mess/23: unexpected split directory (split is 23)",
        "control/me: missing (every program needs this host's name)",
        "queue/bounce: missing (should be a directory)",
    }
    assert set(lines) == expected, lines


@pytest.mark.slow
@pytest.mark.skipif(not AS_ROOT, reason="only root can give files away")
def test_check_reports_wrong_owner(qmail_home):
    os.chown(os.path.join(qmail_home.queue, "pid"), 0, qmail_home.gid)
    code, lines = check(qmail_home)
    assert code == 1
    assert lines == ["queue/pid: owner uid 0, should be %d (qmailq)" % qmail_home.uid]


@pytest.mark.slow
def test_check_reports_writable_trusted_files_and_readable_logs(qmail_home):
    cdb = os.path.join(qmail_home.path, "users", "cdb")
    open(cdb, "ab").close()
    os.chmod(cdb, 0o666)                      # a local user could rewrite the user table
    os.chmod(os.path.join(qmail_home.path, "control", "rcpthosts"), 0o664)
    os.makedirs(os.path.join(qmail_home.path, "log"), exist_ok=True)
    log = os.path.join(qmail_home.path, "log", "qmail-send.log")
    open(log, "ab").close()
    os.chmod(log, 0o644)
    code, lines = check(qmail_home)
    assert code == 1
    assert set(lines) == {
        "users/cdb: mode 0666 is writable by group or others (fix: chmod go-w users/cdb)",
        "control/rcpthosts: mode 0664 is writable by group or others (fix: chmod go-w control/rcpthosts)",
        "log/qmail-send.log: mode 0644 lets every local user read every envelope address "
        "(fix: chmod o-r log/qmail-send.log)"}, lines


@pytest.mark.slow
@pytest.mark.skipif(not AS_ROOT, reason="only root can give files away")
def test_check_reports_a_trusted_file_owned_by_another_account(qmail_home):
    path = os.path.join(qmail_home.path, "control", "locals")
    os.chown(path, pwd.getpwnam("daemon").pw_uid, 0)
    code, lines = check(qmail_home)
    assert lines == ["control/locals: owned by uid %d; only root may own what qmail trusts "
                     "(fix: chown root control/locals)" % pwd.getpwnam("daemon").pw_uid]


@pytest.mark.slow
def test_check_of_a_dir_backend_home_without_queue_log_is_clean(qmail_home):
    if qmail_home.backend != "dir":
        pytest.skip("the directory backend")
    os.rmdir(os.path.join(qmail_home.queue, "log"))      # as in a home of real qmail
    assert check(qmail_home) == (0, [])
    qmail_home.control("queuebackend", "log\n")
    code, lines = check(qmail_home)
    assert "queue/log: missing (should be a directory)" in lines


@pytest.mark.slow
def test_check_reports_role_without_account(qmail_home):
    qmail_home.control("roles", open(os.path.join(qmail_home.path, "control", "roles")).read()
                       + "qmailr:no-such-user-qmailpy\n")
    code, lines = check(qmail_home)
    assert code == 1
    assert "control/roles: role qmailr: no such user: no-such-user-qmailpy" in lines
    assert any(line.startswith("queue/lock/tcpto: cannot check owner") for line in lines)


def test_check_of_missing_home_fails(qmail_home):
    got = qmail_home.run(["qmailctl", "check", "--home", os.path.join(qmail_home.path, "nope")])
    assert got.returncode == 1


def test_init_refuses_root_as_the_single_user(tmp_path, qmail_home):
    got = qmail_home.run(["qmailctl", "init", "--home", str(tmp_path / "h"), "--user", "root"])
    assert got.returncode == 1 and b"uid 0" in got.stderr
    assert not os.path.exists(tmp_path / "h" / "queue")


def test_init_without_user_as_non_root_is_single_user(tmp_path, qmail_home):
    if AS_ROOT:
        pytest.skip("as root, init without --user uses qmail's own accounts")
    got = qmail_home.run(["qmailctl", "init", "--home", str(tmp_path / "h"), "--me", "x.example"])
    assert got.returncode == 0
    assert privs.single_user(privs.load_roles(str(tmp_path / "h"))) == pwd.getpwuid(os.getuid()).pw_name


@pytest.mark.slow
def test_init_as_root_without_qmail_accounts_explains(tmp_path, qmail_home):
    if not AS_ROOT:
        pytest.skip("needs root")
    try:
        pwd.getpwnam("qmailq")
        pytest.skip("qmail's accounts exist here")
    except KeyError:
        pass
    got = qmail_home.run(["qmailctl", "init", "--home", str(tmp_path / "h")])
    assert got.returncode == 1
    assert b"no such user" in got.stderr and b"--user NAME" in got.stderr


@pytest.mark.parametrize("fqdn, ddom, pdom", [
    ("mail.example.com", "example.com", "example.com"),
    ("a.b.c.example.org", "b.c.example.org", "example.org"),
    ("test.example", "test.example", "test.example"),
    ("localhost", "localhost", "localhost"),
])
def test_installer_conventions(fqdn, ddom, pdom):
    assert default_domain(fqdn) == ddom
    assert plus_domain(fqdn) == pdom


def test_layout_file_parses_and_is_found():
    entries = hierarchy.load_layout()
    paths = [e.path for e in entries]
    for rel in ("queue/pid", "queue/mess", "queue/intd", "queue/todo", "queue/info", "queue/local",
                "queue/remote", "queue/bounce", "queue/lock/trigger", "control", "users", "alias"):
        assert rel in paths
    assert all(paths.index(os.path.dirname(p)) < paths.index(p)
               for p in paths if os.path.dirname(p) and os.path.dirname(p) in paths)
    split = [e for e in entries if e.type == "split"]
    assert sorted(e.path for e in split) == ["queue/info", "queue/local", "queue/mess", "queue/remote"]
    assert len(split[0].paths()) == 24


@pytest.mark.parametrize("text", ["dir queue qmailq qmail", "box queue qmailq qmail 0750",
                                  "dir queue qmailq qmail 07x0", "dir queue qmailq qmail 0750 12"])
def test_malformed_layout_lines_are_rejected(text):
    with pytest.raises(hierarchy.LayoutError):
        hierarchy.parse_layout(text)
