"""qmail-getpw and qmail-pw2u as processes: qmail's rules and output bytes (qmail-getpw.c, qmail-pw2u.c)."""
import os
import pwd

import pytest

from conftest import AS_ROOT

pytestmark = pytest.mark.slow


def test_getpw_prints_the_six_fields_of_an_account_or_the_alias(qmail_home):
    h = qmail_home
    done = h.run(["qmail-getpw", "no-such-account-x-Y"])
    alias = pwd.getpwnam(h.user)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == b"%s\0%d\0%d\0%s/alias\0-\0no-such-account-x-Y\0" % (
        h.user.encode(), alias.pw_uid, alias.pw_gid, h.path.encode())
    me = pwd.getpwuid(os.geteuid())
    done = h.run(["qmail-getpw", me.pw_name.upper() + "-Ext-1"])
    owned = os.path.isdir(me.pw_dir) and os.stat(me.pw_dir).st_uid == me.pw_uid
    if me.pw_uid != 0 and owned:
        assert done.stdout == b"%s\0%d\0%d\0%s\0-\0Ext-1\0" % (
            me.pw_name.encode(), me.pw_uid, me.pw_gid, me.pw_dir.encode())
    else:                               # root (uid 0) or a home it does not own: the alias
        assert done.stdout.startswith(h.user.encode() + b"\0")
        assert done.stdout.endswith(b"\0-\0" + me.pw_name.upper().encode() + b"-Ext-1\0")
    done = h.run(["qmail-getpw"])
    assert (done.returncode, done.stdout) == (100, b"")


@pytest.fixture
def accounts(qmail_home, tmp_path):
    """A passwd text whose homes exist and belong to its uid (not 0)."""
    uid = 12345 if AS_ROOT else os.geteuid()
    homes = {}
    for name in ("alias", "joe", "Upper"):
        d = tmp_path / name
        d.mkdir()
        if AS_ROOT:
            os.chown(d, uid, 0)
        homes[name] = str(d)
    alias = qmail_home.user
    passwd = ("%s:x:%d:7:Alias:%s:/bin/sh\n" % (alias, uid, homes["alias"])
              + "root:x:0:0:root:/root:/bin/sh\n"
              + "joe:x:%d:100:Joe:%s:/bin/sh\n" % (uid, homes["joe"])
              + "Upper:x:%d:100::%s:/bin/sh\n" % (uid, homes["Upper"])
              + "gone:x:%d:1::%s:/bin/sh\n" % (uid, tmp_path / "missing")
              + "notmine:x:%d:1::/:/bin/sh\n" % uid
              + "short:x:%d:1\n" % uid)
    return passwd.encode(), uid, homes


def users_file(home, name, text):
    with open(os.path.join(home.path, "users", name), "w") as f:
        f.write(text)


def test_pw2u_prints_qmails_assignments(qmail_home, accounts):
    h = qmail_home
    passwd, uid, homes = accounts
    done = h.run(["qmail-pw2u"], input=passwd)
    assert (done.returncode, done.stderr) == (0, b"")
    a = ":%s:%d:7:%s:" % (h.user, uid, homes["alias"])
    j = ":joe:%d:100:%s:" % (uid, homes["joe"])
    assert done.stdout.decode() == (
        "+%s-::\n=%s%s::\n+%s-%s-::\n" % (a, h.user, a, h.user, a)
        + "=joe%s::\n+joe-%s-::\n.\n" % (j, j))
    users_file(h, "mailnames", "joe:j.oe:joseph\n")
    users_file(h, "exclude", "# nobody\n%s\n" % "Upper")
    users_file(h, "subusers", "sales:joe:sales:\n")
    users_file(h, "append", "=postmaster:%s:%d:7:%s:::\n" % (h.user, uid, homes["alias"]))
    done = h.run(["qmail-pw2u", "-u", "-C", "-/"], input=passwd)    # -u: Upper is only excluded
    assert done.returncode == 0
    assert done.stdout.decode() == (
        "+%s-/::\n=%s%s::\n" % (a, h.user, a)
        + "=j.oe%s::\n=joseph%s::\n" % (j, j)
        + "=sales%s-/:sales:\n" % j
        + "=postmaster:%s:%d:7:%s:::\n.\n" % (h.user, uid, homes["alias"]))


def test_pw2u_bad_input(qmail_home, accounts, tmp_path):
    h = qmail_home
    passwd, uid, homes = accounts
    done = h.run(["qmail-pw2u", "-h"], input=passwd)
    assert (done.returncode, done.stdout, done.stderr) == (
        111, b"", b"qmail-pw2u: fatal: unable to stat %s\n" % str(tmp_path / "missing").encode())
    done = h.run(["qmail-pw2u"], input=b"joe:x:%d:1::%s:/bin/sh\n" % (uid, homes["joe"].encode()))
    assert (done.returncode, done.stderr) == (111, b"qmail-pw2u: fatal: unable to find %s user\n" % h.user.encode())
    users_file(h, "subusers", "sales:nosuch:sales:\n")
    done = h.run(["qmail-pw2u"], input=passwd)
    assert (done.returncode, done.stdout, done.stderr) == (
        111, b"", b"qmail-pw2u: fatal: unable to find nosuch user for subuser\n")
    assert h.run(["qmail-pw2u", "-x"], input=passwd).returncode == 100
