"""qmail-lspawn through its real pipe protocol: lookups, privileges, K/Z/D replies (docs/delivery.md "qmail-lspawn (root)")."""
import os
import re

import psutil
import pytest

from lspawn_harness import AS_ROOT, maildir_files

MESSAGE = b"From: joe@example.org\nSubject: hello\n\nFrom the start\nline two\n"


def test_maildir_delivery_bytes(users):
    home = users.add("alice")
    letter, text = users.deliver(b"alice@test.example", MESSAGE, sender=b"joe@example.org")
    assert (letter, text) == (b"K", b"did 1+0+0\n")
    files = maildir_files(os.path.join(home, "Maildir"))
    assert list(files.values()) == [
        b"Return-Path: <joe@example.org>\nDelivered-To: alice@test.example\n" + MESSAGE]
    name = next(iter(files))
    # maildir(5)'s unique name: TIME.MusecPpidQcount.HOST (a delivery worker makes many)
    assert re.fullmatch(r"\d+\.M\d{1,6}P\d+Q\d+\." + re.escape(os.uname().nodename), name), name
    st = os.stat(os.path.join(home, "Maildir", "new", name))
    assert (st.st_uid, st.st_mode & 0o777) == (users.qh.uid, 0o600)


def test_several_deliveries_at_once_each_get_a_reply(users):
    home = users.add("alice")
    mess = [users.mess(b"Subject: %d\n\nbody %d\n" % (i, i)) for i in range(5)]
    proc = users.start([users.command(i, m, b"s@x.org", b"alice@test.example")
                        for i, m in enumerate(mess)])
    replies = users.finish(proc)
    assert replies == {i: (b"K", b"did 1+0+0\n") for i in range(5)}
    bodies = sorted(maildir_files(os.path.join(home, "Maildir")).values())
    assert bodies == sorted(b"Return-Path: <s@x.org>\nDelivered-To: alice@test.example\n"
                            b"Subject: %d\n\nbody %d\n" % (i, i) for i in range(5))


def test_mbox_default_delivery_and_empty_sender(users):
    home = users.add("bob", maildir=False)
    letter, text = users.deliver(b"bob@test.example", MESSAGE, sender=b"", defaultdelivery="./Mailbox")
    assert (letter, text) == (b"K", b"did 1+0+0\n")
    with open(os.path.join(home, "Mailbox"), "rb") as f:
        mbox = f.read()
    first, rest = mbox.split(b"\n", 1)
    assert first.startswith(b"From MAILER-DAEMON ")
    assert rest == (b"Return-Path: <>\nDelivered-To: bob@test.example\n"
                    b"From: joe@example.org\nSubject: hello\n\n>From the start\nline two\n\n")


@pytest.mark.slow
def test_nonexistent_user_falls_back_to_alias(users):
    assert users.deliver(b"nosuchuser@test.example") == (
        b"D", b"Sorry, no mailbox here by that name. (#5.1.1)\n")


@pytest.mark.slow
@pytest.mark.parametrize("local", [b"postmaster", b"PostMaster", b"POSTMASTER"])
def test_postmaster_in_any_case_reaches_alias(users, local):
    alias = os.path.join(users.qh.path, "alias")
    users.maildir(os.path.join(alias, "Maildir"))
    users.dotqmail(alias, "-postmaster", "./Maildir/\n")
    assert users.deliver(local + b"@test.example", MESSAGE) == (b"K", b"did 1+0+0\n")
    (body,) = maildir_files(os.path.join(alias, "Maildir")).values()
    assert body.startswith(b"Return-Path: <joe@example.org>\nDelivered-To: "
                           + local + b"@test.example\n")


def test_trash_address_is_accepted_silently(users):
    assert users.deliver(b"@test.example") == (b"K", b"")


def test_recipient_without_at_is_refused(users):
    assert users.deliver(b"alice") == (b"D", b"Sorry, address must include host name. (#5.1.3)\n")


def test_uid_0_refused(users):
    home = users.add("rooty", uid=0, gid=0)
    assert users.deliver(b"rooty@test.example") == (
        b"Z", b"Not allowed to perform deliveries as root.\n")
    assert maildir_files(os.path.join(home, "Maildir")) == {}


def test_delivered_to_loop(users):
    home = users.add("alice")
    looping = b"Received: x\nDelivered-To: alice@test.example\nSubject: loop\n\nbody\n"
    assert users.deliver(b"alice@test.example", looping) == (
        b"D", b"This message is looping: it already has my Delivered-To line. (#5.4.6)\n")
    # The same line in the body, or for another address, is no loop.
    fine = b"Delivered-To: alice@other.example\nSubject: x\n\nDelivered-To: alice@test.example\n"
    assert users.deliver(b"alice@test.example", fine) == (b"K", b"did 1+0+0\n")
    assert len(maildir_files(os.path.join(home, "Maildir"))) == 1


@pytest.mark.slow
def test_no_program_is_executed_per_delivery(users):
    """The delivery runs in a forked child of qmail-lspawn that execs nothing: with no
    qmail-local on PATH it still delivers, and the process running the .qmail program's
    shell is qmail-lspawn's child with qmail-lspawn's own command line."""
    home = users.add("ivan")
    users.dotqmail(home, "", "./Maildir/\n|/bin/cat /proc/$PPID/cmdline > cmdline; "
                             "/bin/cat /proc/$PPID/stat > stat\n")
    env = dict(users.qh.env, PATH="/nonexistent")
    proc = users.start([users.command(0, users.mess(MESSAGE), b"joe@example.org", b"ivan@test.example")],
                       env=env)
    users.wait_greeting(proc)           # exec'd and running: its command line is final
    lspawn_cmdline = psutil.Process(proc.pid).cmdline()
    assert users.finish(proc) == {0: (b"K", b"did 1+0+1\n")}
    assert len(maildir_files(os.path.join(home, "Maildir"))) == 1
    with open(os.path.join(home, "cmdline"), "rb") as f:
        assert f.read().split(b"\0")[:-1] == [arg.encode() for arg in lspawn_cmdline]
    with open(os.path.join(home, "stat"), "rb") as f:
        child_stat = f.read()
    ppid = int(child_stat[child_stat.rindex(b")") + 2:].split()[1])
    assert ppid == proc.pid


@pytest.mark.slow
def test_unreadable_dotqmail_is_temporary(users):
    home = users.add("carol")
    users.dotqmail(home, "", "./Maildir/\n", mode=0o000)
    assert users.deliver(b"carol@test.example") == (
        b"Z", b"Unable to open .qmail: access denied. (#4.3.0)\n")


def test_program_killed_by_signal_is_temporary(users):
    home = users.add("dave")
    users.dotqmail(home, "", "|kill -9 $$\n")
    assert users.deliver(b"dave@test.example") == (b"Z", b"Aack, child crashed. (#4.3.0)\n")


def test_maildir_on_read_only_path_is_temporary(users):
    home = users.add("erin")
    os.chmod(os.path.join(home, "Maildir", "tmp"), 0o500)
    assert users.deliver(b"erin@test.example") == (
        b"Z", b"Temporary error on maildir delivery. (#4.3.0)\n")
    assert os.listdir(os.path.join(home, "Maildir", "new")) == []


@pytest.mark.slow
def test_missing_maildir_is_temporary(users):
    users.add("frank", maildir=False)
    assert users.deliver(b"frank@test.example") == (
        b"Z", b"Unable to chdir to maildir. (#4.2.1)\n")


@pytest.mark.slow
def test_writable_home_is_refused(users):
    home = users.add("gina")
    os.chmod(home, 0o757)
    assert users.deliver(b"gina@test.example") == (
        b"Z", b"Uh-oh: home directory is writable. (#4.7.0)\n")


@pytest.mark.slow
def test_long_report_is_cut(users):
    home = users.add("hal")
    users.dotqmail(home, "", "|head -c 5000 /dev/zero | tr '\\0' x\n")
    letter, text = users.deliver(b"hal@test.example")
    assert letter == b"K"
    assert text == b"x" * 2966 + b"\nError report too long, sorry.\n"


def test_report_cut_at_nul(users):
    home = users.add("ivy")
    users.dotqmail(home, "", "|printf 'before\\000after'; exit 100\n")
    assert users.deliver(b"ivy@test.example") == (b"D", b"before")


@pytest.mark.skipif(AS_ROOT, reason="as root qmail-lspawn can become any uid")
def test_not_root_other_uid_is_temporary(users):
    other = 65534 if os.getuid() != 65534 else 65533
    users.add("zed", uid=other, gid=other)
    assert users.deliver(b"zed@test.example") == (
        b"Z", b"Unable to deliver as uid %d: qmail-lspawn runs as uid %d, not root. (#4.3.0)\n"
        % (other, os.getuid()))


@pytest.mark.skipif(not AS_ROOT, reason="only root can switch users")
def test_root_switches_to_the_recipient(users):
    home = users.add("jack")
    users.dotqmail(home, "", "|id -u > uid; id -G > groups\n")
    assert users.deliver(b"jack@test.example") == (b"K", b"did 0+0+1\n")
    with open(os.path.join(home, "uid")) as f:
        assert int(f.read()) == users.qh.uid
    with open(os.path.join(home, "groups")) as f:
        assert f.read().split() == [str(users.qh.gid)]


def test_wrong_owner_of_message(users):
    if not AS_ROOT:
        pytest.skip("only root can give the mess file another owner")
    users.add("alice")
    mess = users.mess(MESSAGE)
    os.chown(os.path.join(users.qh.queue, "mess", mess.decode()), 0, 0)
    proc = users.start([users.command(3, mess, b"s@x", b"alice@test.example")])
    assert users.finish(proc) == {3: (b"Z", b"Sorry, message has wrong owner. (#4.3.5)\n")}


def test_missing_defaultdelivery_argument(qmail_home):
    assert qmail_home.run(["qmail-lspawn"], input=b"").returncode == 100


@pytest.mark.slow
def test_compiled_users_cdb_is_used(users):
    from qmailpy.local.users import compile_assign
    home = users.add("team-", dash="-", wildcard=True)
    users.dotqmail(home, "-default", "./Maildir/\n")
    compile_assign(users.qh.path)
    os.unlink(os.path.join(users.qh.path, "users", "assign"))
    assert users.deliver(b"Team-Sales@test.example") == (b"K", b"did 1+0+0\n")
    (body,) = maildir_files(os.path.join(home, "Maildir")).values()
    assert b"Delivered-To: Team-Sales@test.example\n" in body


@pytest.mark.slow
def test_malformed_assign_is_temporary(users):
    path = os.path.join(users.qh.path, "users", "assign")
    with open(path, "w") as f:
        f.write("=alice:x:1:1:/nowhere:::\n")         # no final '.'
    assert users.deliver(b"alice@test.example") == (
        b"Z", b"Trouble reading users/cdb in qmail-lspawn.\n")


@pytest.mark.slow
def test_missing_alias_user_is_temporary(users):
    with open(os.path.join(users.qh.path, "control", "roles"), "a") as f:
        f.write("alias:no-such-account-qmailpy\n")
    assert users.deliver(b"nosuchuser@test.example") == (b"Z", b"Unable to find alias user!\n")
