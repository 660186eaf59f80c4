"""qmail-local's .qmail handling, driven through qmail-lspawn (dot-qmail(5); docs/delivery.md "qmail-local")."""
import os

import pytest

from lspawn_harness import maildir_files
from qmailpy.envelope import parse_todo

MESSAGE = b"From: joe@example.org\nSubject: hello\n\nbody line\n"


def delivered(home, sub="Maildir"):
    return list(maildir_files(os.path.join(home, sub)).values())


@pytest.mark.slow
def test_ext_and_default_files(users):
    home = users.add("joe-", dash="-", wildcard=True)
    for sub in ("A", "B", "C", "D"):
        users.maildir(os.path.join(home, sub))
    users.dotqmail(home, "-foo", "./A/\n")
    users.dotqmail(home, "-bar-default", "./B/\n")
    users.dotqmail(home, "-default", "./C/\n")
    users.dotqmail(home, "-x:y", "./D/\n")          # '.' in an extension becomes ':'
    for local, sub in ((b"joe-foo", "A"), (b"joe-FOO", "A"), (b"joe-bar-baz", "B"),
                       (b"joe-bar-", "B"), (b"joe-other", "C"), (b"joe-x.y", "D")):
        assert users.deliver(local + b"@test.example") == (b"K", b"did 1+0+0\n"), local
        (body,) = maildir_files(os.path.join(home, sub)).values()
        assert b"Delivered-To: " + local + b"@test.example\n" in body
        for name in os.listdir(os.path.join(home, sub, "new")):
            os.unlink(os.path.join(home, sub, "new", name))


def test_ext_without_file_and_without_default_is_permanent(users):
    home = users.add("kim-", dash="-", wildcard=True)
    users.dotqmail(home, "-foo", "./Maildir/\n")
    assert users.deliver(b"kim-foo@test.example") == (b"K", b"did 1+0+0\n")
    assert users.deliver(b"kim-bar@test.example") == (
        b"D", b"Sorry, no mailbox here by that name. (#5.1.1)\n")


def test_program_environment(users):
    home = users.add("lee-", dash="-", wildcard=True)
    users.dotqmail(home, "-list-default", "|env > env.out; cat > stdin.out\n")
    letter, text = users.deliver(b"lee-list-Sub-Tom=x.org@mail.test.example", MESSAGE,
                                 sender=b"Joe Doe@example.org")
    assert (letter, text) == (b"K", b"did 0+0+1\n")
    with open(os.path.join(home, "stdin.out"), "rb") as f:
        assert f.read() == MESSAGE
    with open(os.path.join(home, "env.out"), "rb") as f:
        env = dict(line.split(b"=", 1) for line in f.read().split(b"\n") if b"=" in line)
    expect = {
        b"USER": users.qh.user.encode(), b"HOME": home.encode(),
        b"LOCAL": b"lee-list-Sub-Tom=x.org", b"HOST": b"mail.test.example",
        b"RECIPIENT": b"lee-list-Sub-Tom=x.org@mail.test.example",
        b"SENDER": b"Joe Doe@example.org", b"NEWSENDER": b"Joe Doe@example.org",
        b"EXT": b"list-Sub-Tom=x.org", b"EXT2": b"Sub-Tom=x.org", b"EXT3": b"Tom=x.org",
        b"EXT4": b"", b"HOST2": b"mail.test", b"HOST3": b"mail", b"HOST4": b"mail",
        b"DEFAULT": b"Sub-Tom=x.org",
    }
    assert {k: env.get(k) for k in expect} == expect
    # Multi-line values: env prints them across lines, so read them from the file text.
    with open(os.path.join(home, "env.out"), "rb") as f:
        text = f.read()
    assert b"DTLINE=Delivered-To: lee-list-Sub-Tom=x.org@mail.test.example\n" in text
    assert b'RPLINE=Return-Path: <"Joe Doe"@example.org>\n' in text
    assert b"UFLINE=From Joe-Doe@example.org " in text


@pytest.mark.slow
@pytest.mark.parametrize("code,expect", [
    (0, (b"K", b"out\ndid 0+0+1\n")),
    (100, (b"D", b"out\n")),
    (64, (b"D", b"out\n")),
    (112, (b"D", b"out\n")),
    (111, (b"Z", b"out\n")),
    (1, (b"Z", b"out\n")),
])
def test_program_exit_codes(users, code, expect):
    home = users.add("meg")
    users.dotqmail(home, "", "|echo out; exit %d\n" % code)
    assert users.deliver(b"meg@test.example") == expect


@pytest.mark.slow
def test_exit_99_skips_later_lines_but_forwards_still_go(users):
    home = users.add("ned")
    users.dotqmail(home, "", "&ned-fwd@elsewhere.example\n|exit 99\n./Maildir/\n")
    letter, text = users.deliver(b"ned@test.example")
    assert letter == b"K"
    assert text.startswith(b"did 0+1+1\nqp ")
    assert delivered(home) == []


@pytest.mark.slow
def test_failure_stops_later_lines(users):
    home = users.add("olga")
    users.dotqmail(home, "", "./Maildir/\n|echo no; exit 100\n./Mailbox\n")
    assert users.deliver(b"olga@test.example") == (b"D", b"no\n")
    assert len(delivered(home)) == 1               # earlier lines have happened
    assert not os.path.exists(os.path.join(home, "Mailbox"))


def test_forward_is_requeued(users):
    home = users.add("pat")
    users.dotqmail(home, "", "# forward both\n&one@remote.example\ntwo@remote.example\n")
    letter, text = users.deliver(b"pat@test.example", MESSAGE, sender=b"joe@example.org")
    assert letter == b"K"
    assert text.startswith(b"did 0+2+0\nqp ")
    qp = int(text.split(b"qp ")[1])
    todo_dir = os.path.join(users.qh.queue, "todo")
    (name,) = os.listdir(todo_dir)
    with open(os.path.join(todo_dir, name), "rb") as f:
        todo = parse_todo(f.read())
    assert (todo.pid, todo.sender, todo.recipients) == (
        qp, b"joe@example.org", [b"one@remote.example", b"two@remote.example"])
    with open(os.path.join(users.qh.queue, "mess", str(int(name) % 23), name), "rb") as f:
        mess = f.read()
    assert mess.startswith(b"Received: (qmail %d invoked " % qp)
    assert mess.endswith(b"\nDelivered-To: pat@test.example\n" + MESSAGE)


@pytest.mark.slow
def test_forward_newsender_from_owner_files(users):
    home = users.add("list-", dash="-", wildcard=True)
    users.dotqmail(home, "-news", "&reader@remote.example\n")
    users.dotqmail(home, "-news-owner", "&boss@remote.example\n")
    users.deliver(b"list-news@test.example", sender=b"joe@example.org")
    users.dotqmail(home, "-news-owner-default", "&boss@remote.example\n")
    users.deliver(b"list-news@test.example", sender=b"joe@example.org")
    users.deliver(b"list-news@test.example", sender=b"")     # bounces keep their sender
    todo_dir = os.path.join(users.qh.queue, "todo")
    senders = []
    for name in sorted(os.listdir(todo_dir), key=int):
        with open(os.path.join(todo_dir, name), "rb") as f:
            senders.append(parse_todo(f.read()).sender)
    assert sorted(senders) == sorted([b"list-news-owner@test.example",
                                      b"list-news-owner-@test.example-@[]", b""])


def test_forward_only_refuses_file_and_program_lines(users):
    home = users.add("quin")
    users.dotqmail(home, "", "./Maildir/\n", mode=0o744)
    assert users.deliver(b"quin@test.example") == (
        b"Z", b"Uh-oh: .qmail has file delivery but has x bit set. (#4.7.0)\n")
    users.dotqmail(home, "", "+list\n|true\n")
    assert users.deliver(b"quin@test.example") == (
        b"Z", b"Uh-oh: .qmail has prog delivery but has x bit set. (#4.7.0)\n")


@pytest.mark.slow
def test_comments_only_delivers_nothing(users):
    home = users.add("rita")
    users.dotqmail(home, "", "# nothing here\n\n# still nothing\n")
    assert users.deliver(b"rita@test.example") == (b"K", b"did 0+0+0\n")
    assert delivered(home) == []


@pytest.mark.slow
def test_blank_first_line_and_empty_file(users):
    home = users.add("sam")
    users.dotqmail(home, "", "\n./Maildir/\n")
    assert users.deliver(b"sam@test.example") == (
        b"Z", b"Uh-oh: first line of .qmail file is blank. (#4.2.1)\n")
    users.dotqmail(home, "", "")                    # empty: the default delivery
    assert users.deliver(b"sam@test.example") == (b"K", b"did 1+0+0\n")
    assert len(delivered(home)) == 1


def test_trailing_blanks_and_no_final_newline(users):
    home = users.add("tess")
    users.maildir(os.path.join(home, "Other"))
    users.dotqmail(home, "", "./Other/ \t")
    assert users.deliver(b"tess@test.example") == (b"K", b"did 1+0+0\n")
    assert len(delivered(home, "Other")) == 1


def test_writable_dotqmail_is_refused(users):
    home = users.add("uma")
    users.dotqmail(home, "", "./Maildir/\n", mode=0o646)
    assert users.deliver(b"uma@test.example") == (
        b"Z", b"Uh-oh: .qmail file is writable. (#4.7.0)\n")


def test_sticky_home_means_user_is_editing(users):
    home = users.add("vic")
    os.chmod(home, 0o1755)
    assert users.deliver(b"vic@test.example") == (
        b"Z", b"Home directory is sticky: user is editing his .qmail file. (#4.2.1)\n")


def test_dotqmail_that_is_not_a_file_counts_as_absent(users):
    home = users.add("walt")
    os.mkfifo(os.path.join(home, ".qmail"))
    users.own(os.path.join(home, ".qmail"))
    assert users.deliver(b"walt@test.example") == (b"K", b"did 1+0+0\n")
    assert len(delivered(home)) == 1
