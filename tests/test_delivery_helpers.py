"""qmail's delivery helpers (docs/delivery.md "Delivery helpers"): preline, condredirect,
bouncesaying, except, maildirmake and forward, each run as the installed program, with
what a .qmail program line sees: the message on stdin, qmail-local's variables, exit
codes and the text on stderr that becomes the delivery report.

Queueing is checked twice: against a recording QMAILQUEUE program (the exact message
and envelope bytes qmail-queue is given, and each of its failure codes), and through
the real qmail-queue into a test home's queue.
"""
import os
import re
import stat
import subprocess
import sys

import pytest

from conftest import VENV_BIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MSG = b"Subject: helpers\n\nhello\n"
UFLINE = b"From joe@far.example Wed Nov 25 10:00:00 2026\n"
RPLINE = b"Return-Path: <joe@far.example>\n"
DTLINE = b"Delivered-To: bench-x@test.example\n"

RECORDER = """#!/bin/sh
# a QMAILQUEUE stand-in: keeps what it is given, exits $QQ_EXIT
cat > "$QQ_RECORD/message" || exit 54
cat <&1 > "$QQ_RECORD/envelope" || exit 54
exit "${QQ_EXIT:-0}"
"""


@pytest.fixture
def env(tmp_path):
    """qmail-local's environment for a program line, and a recording QMAILQUEUE."""
    record = tmp_path / "record"
    record.mkdir()
    recorder = tmp_path / "recorder"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in ("QMAILQUEUE", "QMAILHOME")}
    # a PATH of directories anyone may search: with one that is not (root's, seen by
    # nobody), a program found nowhere is "access denied", as execvp(3) reports it
    e.update(PATH=os.pathsep.join((VENV_BIN, "/usr/local/bin", "/usr/bin", "/bin")),
             QMAILHOME=str(tmp_path), QMAILQUEUE=str(recorder), QQ_RECORD=str(record))
    eb = {os.fsencode(k): os.fsencode(v) for k, v in e.items()}
    eb.update({b"UFLINE": UFLINE, b"RPLINE": RPLINE, b"DTLINE": DTLINE,
               b"SENDER": b"joe@far.example", b"NEWSENDER": b"bench-owner@test.example"})
    return eb


def run(env, argv, message=MSG, stdin=None, drop=(), **kw):
    """Run an installed helper with the message on stdin (a seekable file, as
    qmail-local gives it, unless stdin is given); a CompletedProcess."""
    env = {k: v for k, v in env.items() if k not in drop}
    argv = [os.path.join(VENV_BIN, argv[0])] + list(argv[1:])
    if stdin is None:
        import tempfile
        with tempfile.TemporaryFile() as f:
            f.write(message)
            f.seek(0)
            return subprocess.run(argv, stdin=f, env=env, capture_output=True, timeout=60, **kw)
    return subprocess.run(argv, stdin=stdin, input=None, env=env, capture_output=True, timeout=60, **kw)


def recorded(env):
    """(message, envelope) the recording qmail-queue got, or None if it never ran."""
    record = env[b"QQ_RECORD"]
    try:
        with open(os.path.join(record, b"message"), "rb") as m, \
                open(os.path.join(record, b"envelope"), "rb") as e:
            return m.read(), e.read()
    except FileNotFoundError:
        return None


# --- preline ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("options, head", [
    ([], UFLINE + RPLINE + DTLINE),
    (["-f"], RPLINE + DTLINE),
    (["-r"], UFLINE + DTLINE),
    (["-d"], UFLINE + RPLINE),
    (["-frd"], b""),
    (["-f", "-d", "--"], RPLINE),
    (["-fF"], UFLINE + RPLINE + DTLINE),
])
def test_preline_prepends_the_lines(env, options, head):
    done = run(env, ["preline"] + options + ["cat"])
    assert (done.returncode, done.stdout, done.stderr) == (0, head + MSG, b"")


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 99, 100, 77, 111, 3])
def test_preline_exits_with_the_programs_code(env, code):
    done = run(env, ["preline", "sh", "-c", "cat; echo said >&2; exit %d" % code])
    assert (done.returncode, done.stdout, done.stderr) == (code, UFLINE + RPLINE + DTLINE + MSG, b"said\n")


def test_preline_a_large_message_whole_and_a_program_that_stops_reading(env):
    big = b"Subject: big\n\n" + b"x" * 99 + b"\n" * 1 + (b"y" * 1023 + b"\n") * 2048
    done = run(env, ["preline", "-frd", "cat"], message=big)
    assert (done.returncode, done.stdout) == (0, big)
    done = run(env, ["preline", "sh", "-c", "head -c 10; exit 7"], message=big)
    assert (done.returncode, done.stdout, done.stderr) == (7, UFLINE[:10], b"")


@pytest.mark.slow
@pytest.mark.parametrize("argv, drop, code, text", [
    (["preline"], (), 100, b"preline: usage: preline cmd [ arg ... ]\n"),
    (["preline", "-x", "cat"], (), 100, b"preline: usage: preline cmd [ arg ... ]\n"),
    (["preline", "-f"], (), 100, b"preline: usage: preline cmd [ arg ... ]\n"),
    (["preline", "cat"], (b"DTLINE",), 100, b"preline: usage: preline cmd [ arg ... ]\n"),
    (["preline", "no-such-program-here"], (), 100,
     b"preline: fatal: unable to run no-such-program-here: file does not exist\n"),
    (["preline", "sh", "-c", "kill -9 $$"], (), 111, b"preline: fatal: child crashed\n"),
])
def test_preline_refuses(env, argv, drop, code, text):
    done = run(env, argv, drop=drop)
    assert (done.returncode, done.stderr) == (code, text)


# --- except, bouncesaying ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("program, code, text", [
    (["true"], 100, b""),
    (["false"], 0, b""),
    (["sh", "-c", "exit 100"], 0, b""),
    (["sh", "-c", "exit 111"], 111, b"except: fatal: temporary child error\n"),
    (["sh", "-c", "kill -9 $$"], 111, b"except: fatal: child crashed\n"),
    (["no-such-program-here"], 0, b""),
    (["grep", "-q", "^Subject: helpers"], 100, b""),        # the program reads the message
    ([], 100, b"except: usage: except program [ arg ... ]\n"),
])
def test_except_inverts(env, program, code, text):
    done = run(env, ["except"] + program)
    assert (done.returncode, done.stderr) == (code, text)


@pytest.mark.slow
@pytest.mark.parametrize("argv, code, text", [
    (["Not here any more."], 100, b"Not here any more.\n"),
    (["Spam.", "grep", "-q", "^Subject: helpers"], 100, b"Spam.\n"),
    (["Spam.", "grep", "-q", "^Subject: cheap"], 0, b""),
    (["Spam.", "sh", "-c", "exit 111"], 111, b"bouncesaying: fatal: temporary child error\n"),
    (["Spam.", "sh", "-c", "kill -9 $$"], 111, b"bouncesaying: fatal: child crashed\n"),
    (["Spam.", "no-such-program-here"], 0, b""),
    ([], 100, b"bouncesaying: usage: bouncesaying error [ program [ arg ... ] ]\n"),
])
def test_bouncesaying(env, argv, code, text):
    done = run(env, ["bouncesaying"] + argv)
    assert (done.returncode, done.stderr) == (code, text)


# --- maildirmake ---------------------------------------------------------------

@pytest.mark.slow
def test_maildirmake_makes_a_private_maildir(env, tmp_path):
    target = tmp_path / "Maildir"
    done = run(env, ["maildirmake", str(target)], umask=0)
    assert (done.returncode, done.stderr) == (0, b"")
    for path in (target, target / "tmp", target / "new", target / "cur"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    assert sorted(os.listdir(target)) == ["cur", "new", "tmp"]
    again = run(env, ["maildirmake", str(target)])
    assert (again.returncode, again.stderr) == (
        111, b"maildirmake: fatal: unable to mkdir %s: file already exists\n" % bytes(target))
    missing = tmp_path / "no" / "Maildir"
    done = run(env, ["maildirmake", str(missing)])
    assert (done.returncode, done.stderr) == (
        111, b"maildirmake: fatal: unable to mkdir %s: file does not exist\n" % bytes(missing))
    done = run(env, ["maildirmake"])
    assert (done.returncode, done.stderr) == (100, b"maildirmake: usage: maildirmake name\n")


# --- forward -------------------------------------------------------------------

def qp_of(stderr, prog):
    found = re.fullmatch(rb"%s: qp (\d+)\n" % prog, stderr)
    assert found, stderr
    return int(found.group(1))


def test_forward_queues_dtline_and_message_from_newsender(env):
    done = run(env, ["forward", "a@example.org", "b@example.net"])
    assert done.returncode == 0, done.stderr
    assert qp_of(done.stderr, b"forward") > 0
    assert recorded(env) == (DTLINE + MSG,
                             b"Fbench-owner@test.example\0Ta@example.org\0Tb@example.net\0\0")


@pytest.mark.parametrize("qq_exit, code, text", [
    ("31", 100, b"forward: fatal: mail server permanently rejected message (#5.3.0)\n"),
    ("71", 111, b"forward: fatal: mail server temporarily rejected message (#4.3.0)\n"),
    ("53", 111, b"forward: fatal: qq write error or disk full (#4.3.0)\n"),
])
def test_forward_reports_queue_failures(env, qq_exit, code, text):
    env[b"QQ_EXIT"] = qq_exit.encode()
    done = run(env, ["forward", "a@example.org"])
    assert (done.returncode, done.stderr) == (code, text)


@pytest.mark.parametrize("argv, drop, text", [
    ([], (), b"forward: usage: forward address [ address ... ]\n"),
    (["a@example.org"], (b"NEWSENDER",), b"forward: fatal: NEWSENDER not set\n"),
    (["a@example.org"], (b"DTLINE",), b"forward: fatal: DTLINE not set\n"),
])
def test_forward_refuses_without_what_it_needs(env, argv, drop, text):
    done = run(env, ["forward"] + argv, drop=drop)
    assert (done.returncode, done.stderr) == (100, text)
    assert recorded(env) is None


# --- condredirect --------------------------------------------------------------

def test_condredirect_forwards_the_whole_message_when_the_program_says_yes(env):
    # the program reads the message to its end: condredirect rewinds before queueing
    done = run(env, ["condredirect", "boss@example.org", "grep", "-q", "hello"])
    assert done.returncode == 99, done.stderr
    qp_of(done.stderr, b"condredirect")
    assert recorded(env) == (DTLINE + MSG, b"Fjoe@far.example\0Tboss@example.org\0\0")


@pytest.mark.slow
@pytest.mark.parametrize("program, code, text", [
    (["false"], 0, b""),
    (["sh", "-c", "exit 100"], 0, b""),
    (["no-such-program-here"], 0, b""),
    (["sh", "-c", "exit 111"], 111, b"condredirect: fatal: temporary child error\n"),
    (["sh", "-c", "kill -9 $$"], 111, b"condredirect: fatal: child crashed\n"),
])
def test_condredirect_leaves_the_message_alone_otherwise(env, program, code, text):
    done = run(env, ["condredirect", "boss@example.org"] + program)
    assert (done.returncode, done.stderr) == (code, text)
    assert recorded(env) is None


@pytest.mark.parametrize("argv, drop, code, text", [
    ([], (), 100, b"condredirect: usage: condredirect newaddress program [ arg ... ]\n"),
    (["boss@example.org"], (), 100, b"condredirect: usage: condredirect newaddress program [ arg ... ]\n"),
    (["boss@example.org", "true"], (b"SENDER",), 100, b"condredirect: fatal: SENDER not set\n"),
    (["boss@example.org", "true"], (b"DTLINE",), 100, b"condredirect: fatal: DTLINE not set\n"),
])
def test_condredirect_refuses(env, argv, drop, code, text):
    done = run(env, ["condredirect"] + argv, drop=drop)
    assert (done.returncode, done.stderr) == (code, text)
    assert recorded(env) is None


def test_condredirect_on_a_pipe_cannot_rewind(env):
    r, w = os.pipe()
    os.write(w, MSG)
    os.close(w)
    try:
        done = run(env, ["condredirect", "boss@example.org", "true"], stdin=r)
    finally:
        os.close(r)
    assert (done.returncode, done.stderr) == (
        111, b"condredirect: fatal: unable to rewind: unseekable descriptor\n")
    assert recorded(env) is None


# --- through the real qmail-queue ------------------------------------------------

@pytest.mark.slow
def test_forward_and_condredirect_into_a_real_queue(qmail_home, env):
    from queue_view import queued
    env = dict(env)
    del env[b"QMAILQUEUE"]
    env[b"QMAILHOME"] = os.fsencode(qmail_home.path)
    done = run(env, ["forward", "a@example.org"])
    assert done.returncode == 0, done.stderr
    fwd_qp = qp_of(done.stderr, b"forward")
    done = run(env, ["condredirect", "boss@example.org", "true"])
    assert done.returncode == 99, done.stderr
    cond_qp = qp_of(done.stderr, b"condredirect")
    # told apart by recipient: a message's number is its inode, in no particular order
    by_recipient = {tuple(q.recipients): q for q in queued(qmail_home)}
    first, second = by_recipient[(b"a@example.org",)], by_recipient[(b"boss@example.org",)]
    assert len(by_recipient) == 2
    assert first.sender == b"bench-owner@test.example"
    assert second.sender == b"joe@far.example"
    for q, qp in ((first, fwd_qp), (second, cond_qp)):
        # "by uid 0" as root; a single-user home's owner is its alias role ("by alias")
        assert re.match(rb"Received: \(qmail %d invoked by [^)]+\); " % qp, q.mess)
        assert q.body_after_received(1) == DTLINE + MSG


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as a user without queue rights")
def test_forward_without_queue_rights_goes_through_qmail_qmqpd(qmail_home, env):
    from qmqpd_harness import QmqpServer
    from queue_view import queued
    env = dict(env)
    del env[b"QMAILQUEUE"]
    env[b"QMAILHOME"] = os.fsencode(qmail_home.path)
    stranger = 54321                    # owns nothing in the home: no queue rights
    assert stranger not in (qmail_home.uid, 0)
    done = run(env, ["forward", "a@example.org"], user=stranger, group=stranger, extra_groups=[],
               cwd="/")
    assert done.returncode == 111 and b"is qmail-qmqpd running?" in done.stderr, done.stderr
    with QmqpServer(qmail_home):
        done = run(env, ["forward", "a@example.org"], user=stranger, group=stranger,
                   extra_groups=[], cwd="/")
    assert done.returncode == 0, done.stderr
    qp = qp_of(done.stderr, b"forward")
    (q,) = queued(qmail_home)
    assert (q.sender, q.recipients, q.uid) == (b"bench-owner@test.example", [b"a@example.org"], stranger)
    assert re.match(rb"Received: \(qmail %d invoked by uid %d\); " % (qp, stranger), q.mess)
    assert q.body_after_received(1) == DTLINE + MSG


# --- start-up cost ---------------------------------------------------------------

@pytest.mark.parametrize("module", ["preline", "condredirect", "bouncesaying", "except_",
                                    "maildirmake", "forward"])
def test_helpers_import_only_what_they_use(module):
    # -IS as the launchers in QMAILHOME/bin start them (site's own imports left out)
    code = "import sys; sys.path.append(%r); import qmailpy.cli.%s" % (ROOT, module)
    done = subprocess.run([sys.executable, "-IS", "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    for heavy in ("enum", "subprocess", "socket", "qmailpy.queue.client", "qmailpy.local.deliver",
                  "qmailpy.home"):
        assert heavy not in imported, heavy


# --- in .qmail files, delivered by qmail-send --------------------------------------

@pytest.mark.slow
def test_helpers_in_dot_qmail_files_end_to_end(qmail_home, users, daemons):
    """`|preline cat > file`, condredirect, forward and bouncesaying as program lines of
    a running qmail-send: found on PATH in QMAILHOME/bin, given qmail-local's variables,
    their exit codes read as qmail-local reads them."""
    from delivery_support import MSG as E2E_MSG, queue, wait_maildir
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    out = os.path.join(bench, "preline-out")
    users.dotqmail(bench, "-pre", "|preline cat > %s\n" % out)
    users.dotqmail(bench, "-cond", "|condredirect bench@test.example true\n|exit 100\n")
    users.dotqmail(bench, "-fwd", "|forward bench@test.example\n")
    users.dotqmail(bench, "-gone", "|bouncesaying 'This address is no longer in use.'\n")
    assert os.path.exists(os.path.join(qmail_home.path, "bin", "preline"))
    daemons.start()
    daemons.wait_line(r"^status: ")

    queue(qmail_home, b"joe@far.example", [b"bench-pre@test.example"])
    lines = daemons.wait_line(r"^end msg ")
    assert "delivery 1: success: did_0+0+1/" in lines, lines
    with open(out, "rb") as f:
        got = f.read()
    head = re.match(rb"From joe@far\.example \w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\n"
                    rb"Return-Path: <joe@far\.example>\nDelivered-To: bench-pre@test\.example\n"
                    rb"Received: \(qmail \d+ invoked by [^)]+\); [^\n]+\n", got)
    assert head, got
    assert got[head.end():] == E2E_MSG

    queue(qmail_home, b"joe@far.example", [b"bench-cond@test.example"])
    lines = daemons.wait_line(r"^end msg ", 3)
    assert [l for l in lines if re.fullmatch(r"delivery 2: success: condredirect:_qp_\d+/did_0\+0\+1/", l)], lines
    queue(qmail_home, b"joe@far.example", [b"bench-fwd@test.example"])
    lines = daemons.wait_line(r"^end msg ", 5)
    assert [l for l in lines if re.fullmatch(r"delivery \d+: success: forward:_qp_\d+/did_0\+0\+1/", l)], lines
    copies = wait_maildir(os.path.join(bench, "Maildir"), 2)
    assert sorted(re.findall(rb"Delivered-To: (bench-\w+)@", m)[-1] for m in copies) == [b"bench-cond", b"bench-fwd"]
    for m in copies:
        assert m.startswith(b"Return-Path: <joe@far.example>\nDelivered-To: bench@test.example\n")
        assert m.endswith(b"\n" + E2E_MSG)

    queue(qmail_home, b"bench@test.example", [b"bench-gone@test.example"])
    lines = daemons.wait_line(r"^end msg ", 7)
    assert [l for l in lines if re.fullmatch(r"delivery \d+: failure: This_address_is_no_longer_in_use./", l)], lines
    bounce = [m for m in wait_maildir(os.path.join(bench, "Maildir"), 3) if b"failure notice" in m]
    assert bounce and b"<bench-gone@test.example>:\nThis address is no longer in use.\n" in bounce[0]
