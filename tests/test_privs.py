"""Role accounts of a home (control/roles) and switching to them."""
import os
import pwd

import pytest

from qmailpy import privs

AS_ROOT = os.geteuid() == 0


def in_child(fn):
    """fn() in a forked child; its result as text (switching users must not touch pytest)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = repr(fn())
            except Exception as e:
                out = "%s: %s" % (type(e).__name__, e)
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()


def test_defaults_are_qmails_names(tmp_path):
    roles = privs.load_roles(str(tmp_path))
    assert roles == {r: r for r in privs.USER_ROLES + privs.GROUP_ROLES}
    assert privs.single_user(roles) is None


def test_a_roles_file_without_qmaillog_keeps_the_log_files_in_group_qmail(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "roles").write_text("qmailq:daemon\nqmail:daemon\nnofiles:nogroup\n")
    roles = privs.load_roles(str(tmp_path))
    assert roles["qmaillog"] == roles["qmail"] == "daemon"
    (tmp_path / "control" / "roles").write_text("qmail:daemon\nqmaillog:adm\n")
    assert privs.load_roles(str(tmp_path))["qmaillog"] == "adm"


def test_roles_file_round_trip(qmail_home):
    roles = privs.load_roles(qmail_home.path)
    assert {roles[r] for r in privs.USER_ROLES} == {qmail_home.user}
    text = open(os.path.join(qmail_home.path, "control", "roles")).read()
    assert "qmailq:%s\n" % qmail_home.user in text
    qmail_home.control("roles", "# comment\n\nqmailr: daemon \nbogus:x\nqmails\n")
    roles = privs.load_roles(qmail_home.path)
    assert roles["qmailr"] == "daemon" and roles["qmails"] == "qmails" and "bogus" not in roles


def test_become_switches_only_as_root(qmail_home):
    def go():
        switched = privs.become(qmail_home.path, "qmailq")
        return (switched, os.getuid(), os.geteuid(), os.getgid(), sorted(os.getgroups()))
    got = in_child(go)
    if AS_ROOT:
        assert got == repr((True, qmail_home.uid, qmail_home.uid, qmail_home.gid, [qmail_home.gid]))
    else:
        assert got.startswith("(False, %d, %d," % (os.getuid(), os.geteuid()))


def test_become_refuses_a_role_that_is_root(qmail_home):
    qmail_home.control("roles", "qmailq:root\n")
    assert in_child(lambda: privs.become(qmail_home.path, "qmailq")).startswith("RootRefused: ")


def test_single_user_roles_refuse_root():
    with pytest.raises(privs.RootRefused):
        privs.single_user_roles("root")
    with pytest.raises(privs.PrivError):
        privs.single_user_roles("no-such-user-qmailpy")


@pytest.mark.skipif(not AS_ROOT, reason="needs root")
def test_switch_to_refuses_uid_0_and_switches_otherwise():
    assert in_child(lambda: privs.switch_to(0, 0)).startswith("RootRefused: ")
    nobody = pwd.getpwnam("nobody")
    assert in_child(lambda: (privs.switch_to(nobody.pw_uid, nobody.pw_gid), os.getuid())[1]) == \
        str(nobody.pw_uid)
