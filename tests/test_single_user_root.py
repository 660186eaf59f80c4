"""A single-user home started as root runs only as its user (docs/security.md "Single-user homes started as root").

The home's control/ and users/ are its user's (nobody when the tests run as root), so
neither users/assign nor control/roles may name another account for root to become.
"""
import os
import pwd

import pytest

import accounts
from lspawn_harness import maildir_files
from qmailpy import privs
from send_harness import run_send_alone

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root switches accounts")


def other_users_home(users, name, account):
    """users/assign's =name line naming account's uid and gid, with a home and Maildir it owns."""
    pw = pwd.getpwnam(account)
    home = users.add(name, uid=pw.pw_uid, gid=pw.pw_gid)
    for path in (home, os.path.join(home, "Maildir"),
                 *(os.path.join(home, "Maildir", sub) for sub in ("tmp", "new", "cur"))):
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return home, pw


def test_assign_naming_another_account_is_a_temporary_failure(users):
    accounts.ensure_accounts()
    home, pw = other_users_home(users, "web", "qtweb")
    users.dotqmail(home, "", "./Maildir/\n|id -u > uid\n")
    os.chown(os.path.join(home, ".qmail"), pw.pw_uid, pw.pw_gid)
    assert users.deliver(b"web@test.example") == (
        b"Z", b"Unable to switch to uid %d gid %d: this home's control/ belongs to %s (uid %d gid %d),"
        b" which may deliver only as itself. (#4.3.0)\n"
        % (pw.pw_uid, pw.pw_gid, users.qh.user.encode(), users.qh.uid, users.qh.gid))
    assert maildir_files(os.path.join(home, "Maildir")) == {}
    assert not os.path.exists(os.path.join(home, "uid"))


def test_assign_naming_gid_0_is_a_temporary_failure(users):
    home = users.add("wheel", gid=0)
    letter, text = users.deliver(b"wheel@test.example")
    assert (letter, text) == (
        b"Z", b"Unable to switch to uid %d gid 0: this home's control/ belongs to %s (uid %d gid %d),"
        b" which may deliver only as itself. (#4.3.0)\n"
        % (users.qh.uid, users.qh.user.encode(), users.qh.uid, users.qh.gid))
    assert maildir_files(os.path.join(home, "Maildir")) == {}


def test_the_users_own_delivery_still_works(users):
    home = users.add("alice")
    assert users.deliver(b"alice@test.example") == (b"K", b"did 1+0+0\n")
    name, = maildir_files(os.path.join(home, "Maildir"))
    st = os.stat(os.path.join(home, "Maildir", "new", name))
    assert (st.st_uid, st.st_gid) == (users.qh.uid, users.qh.gid)


def test_roles_naming_another_account_keep_the_daemon_from_starting(qmail_home):
    accounts.ensure_accounts()
    roles = privs.load_roles(qmail_home.path)
    roles["qmails"] = "qtweb"
    privs.write_roles(qmail_home.path, roles)
    code, log = run_send_alone(qmail_home)
    assert (code, log) == (111, (
        "alert: cannot start: unable to switch to qmails: role qmails is account qtweb (uid %d), "
        "but control/ belongs to %s (uid %d): a home owned by an account other than root runs "
        "only as that account; refusing\n"
        % (accounts.uid("qtweb"), qmail_home.user, qmail_home.uid)).encode())


def test_roles_naming_another_account_keep_qmail_smtpd_from_serving(qmail_home):
    accounts.ensure_accounts()
    roles = privs.load_roles(qmail_home.path)
    roles["qmaild"] = "qtweb"
    privs.write_roles(qmail_home.path, roles)
    done = qmail_home.run(["qmail-smtpd"], input=b"QUIT\r\n")
    assert (done.returncode, done.stdout) == (1, b"421 unable to read controls (#4.3.0)\r\n")
