"""qmail-local as a program with qmail's arguments (qmail-local(8))."""
import os
import tempfile

import pytest

pytestmark = pytest.mark.slow

USAGE = (b"qmail-local: usage: qmail-local [ -nN ] user homedir local dash ext domain sender"
         b" aliasempty\n")


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "h"
    h.mkdir()
    os.chmod(h, 0o755)
    for sub in ("tmp", "new", "cur"):
        (h / "Maildir" / sub).mkdir(parents=True)
    return h


def local(qmail_home, args, message=b"Subject: x\n\nbody\n", stdin=None):
    """Run qmail-local with the message in a (seekable) file on stdin, or with stdin as given."""
    if stdin is not None:
        return qmail_home.run(["qmail-local"] + args, stdin=stdin)
    with tempfile.TemporaryFile() as f:
        f.write(message)
        f.seek(0)
        return qmail_home.run(["qmail-local"] + args, stdin=f)


def test_delivers_with_qmails_arguments(qmail_home, home):
    done = local(qmail_home, ["--", "u", str(home), "u-x", "-", "x", "test.example", "s@x.org",
                              "./Maildir/"])
    # dash '-' and no .qmail-x or .qmail-default: there is no such address.
    assert (done.returncode, done.stdout + done.stderr) == (
        100, b"Sorry, no mailbox here by that name. (#5.1.1)\n")
    (home / ".qmail-x").write_text("./Maildir/\n")
    done = local(qmail_home, ["u", str(home), "u-x", "-", "x", "test.example", "s@x.org",
                              "./Maildir/"])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"did 1+0+0\n", b"")
    (name,) = os.listdir(home / "Maildir" / "new")
    assert (home / "Maildir" / "new" / name).read_bytes() == (
        b"Return-Path: <s@x.org>\nDelivered-To: u-x@test.example\nSubject: x\n\nbody\n")


@pytest.mark.parametrize("args", [
    [],
    ["u", "/h", "u", "", "", "d", "s"],                          # seven arguments
    ["u", "/h", "u", "", "", "d", "s", "./Maildir/", "extra"],
    ["-x", "u", "/h", "u", "", "", "d", "s", "./Maildir/"],      # unknown option
    ["u", "relative", "u", "", "", "d", "s", "./Maildir/"],      # homedir not absolute
])
def test_usage_errors(qmail_home, args):
    done = local(qmail_home, args)
    assert (done.returncode, done.stdout, done.stderr) == (100, b"", USAGE)


def test_plan_with_n(qmail_home, home):
    (home / ".qmail-plan").write_text(
        "# comment\n./Maildir/\n./Mailbox\n|cat > x  \n&fwd@x.org\nother@y.org\n")
    # -n skips the loop check, so our own Delivered-To line does not matter.
    done = local(qmail_home, ["-n", "u", str(home), "u-plan", "-", "plan", "test.example", "s@x",
                              "./Maildir/"], message=b"Delivered-To: u-plan@test.example\n\nx\n")
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == (b"maildir ./Maildir/\nmbox ./Mailbox\nprogram cat > x\n"
                           b"forward fwd@x.org\nforward other@y.org\ndid 2+2+1\n")
    assert os.listdir(home / "Maildir" / "new") == []
    assert not (home / "x").exists()


def test_plan_warns_about_sticky_home(qmail_home, home):
    os.chmod(home, 0o1755)
    done = local(qmail_home, ["-n", "u", str(home), "u", "", "", "test.example", "s@x",
                              "./Maildir/"])
    assert (done.returncode, done.stdout, done.stderr) == (
        0, b"maildir ./Maildir/\ndid 1+0+0\n", b"Warning: home directory is sticky.\n")


def test_unseekable_stdin(qmail_home, home):
    done = qmail_home.run(["qmail-local", "u", str(home), "u", "", "", "test.example", "s@x",
                           "./Maildir/"], input=b"Subject: x\n\nbody\n")
    assert (done.returncode, done.stderr) == (111, b"Unable to rewind message. (#4.3.0)\n")


def test_missing_home(qmail_home, tmp_path):
    done = local(qmail_home, ["u", str(tmp_path / "gone"), "u", "", "", "test.example", "s@x",
                              "./Maildir/"])
    assert (done.returncode, done.stderr) == (
        111, b"Unable to switch to %s: file does not exist. (#4.3.0)\n" % bytes(tmp_path / "gone"))


def test_imports_only_what_it_uses(qmail_home, home):
    with tempfile.TemporaryFile() as f:
        f.write(b"Subject: x\n\nbody\n")
        f.seek(0)
        done = qmail_home.run(["python", "-X", "importtime", "-m", "qmailpy.cli.qmail_local", "u",
                               str(home), "u", "", "", "test.example", "s@x", "./Maildir/"], stdin=f)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "qmailpy.local.maildir" in imported
    for unused in ("qmailpy.local.mbox", "qmailpy.local.program", "qmailpy.local.forward",
                   "qmailpy.queue.client", "fcntl", "subprocess", "socket"):
        assert unused not in imported
