"""qmail-newu builds users/cdb from users/assign; bad input leaves the old table."""
import os

import pytest

from qmailpy.util import cdb

pytestmark = pytest.mark.slow


def test_newu_builds_the_table_lspawn_reads(qmail_home):
    assign = os.path.join(qmail_home.path, "users", "assign")
    with open(assign, "w") as f:
        f.write("=joe:%s:%d:%d:/tmp/joe:::\n+list-:%s:%d:%d:/tmp/list:-::\n.\n"
                % (qmail_home.user, qmail_home.uid, qmail_home.gid,
                   qmail_home.user, qmail_home.uid, qmail_home.gid))
    proc = qmail_home.run(["qmail-newu"])
    assert proc.returncode == 0, proc.stderr
    table = cdb.CDB.open(os.path.join(qmail_home.path, "users", "cdb"))
    assert table.get(b"!joe\0") == b"%s\0%d\0%d\0/tmp/joe\0\0" % (
        qmail_home.user.encode(), qmail_home.uid, qmail_home.gid)
    assert table.get(b"!list-") is not None


def test_newu_refuses_a_malformed_assign_and_keeps_the_old_table(qmail_home):
    users = os.path.join(qmail_home.path, "users")
    with open(os.path.join(users, "assign"), "w") as f:
        f.write("=joe:nobody:1:1:/tmp/joe:::\n.\n")
    assert qmail_home.run(["qmail-newu"]).returncode == 0
    with open(os.path.join(users, "cdb"), "rb") as f:
        before = f.read()
    with open(os.path.join(users, "assign"), "w") as f:
        f.write("=broken\n.\n")
    proc = qmail_home.run(["qmail-newu"])
    assert proc.returncode == 111
    assert proc.stderr == b"qmail-newu: fatal: bad format in users/assign\n"
    with open(os.path.join(users, "cdb"), "rb") as f:
        assert f.read() == before


def test_newu_without_assign_is_a_temporary_failure(qmail_home):
    path = os.path.join(qmail_home.path, "users", "assign")
    if os.path.exists(path):
        os.unlink(path)
    proc = qmail_home.run(["qmail-newu"])
    assert proc.returncode == 111
    assert proc.stderr == b"qmail-newu: fatal: unable to read users/assign\n"
