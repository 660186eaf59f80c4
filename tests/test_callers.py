"""sendmail and qmail-inject as real callers start them: with fds closed, or with
SIGCHLD ignored. Each queues the message exactly once and exits 0."""
import os
import subprocess
import sys
import time

import pytest

from queue_view import queued

pytestmark = pytest.mark.slow

MESSAGE = b"To: someone@elsewhere.example\nSubject: %s\n\nhello\n"


def run_with(home, argv, tag, close=(), ignore_sigchld=False):
    """Run argv with the message on fd 0 from a parent that closes `close` fds first
    (as GNU mailutils' mail closes 1 and 2) or ignores SIGCHLD (as swaks --pipe)."""
    parent = ("import os, signal, sys\n"
              "%s\n"
              "for fd in %r: os.close(fd)\n"
              "os.execvp(sys.argv[1], sys.argv[1:])\n"
              % ("signal.signal(signal.SIGCHLD, signal.SIG_IGN)" if ignore_sigchld else "", tuple(close)))
    r, w = os.pipe()
    os.write(w, MESSAGE % tag)
    os.close(w)
    try:
        done = subprocess.run([sys.executable, "-c", parent] + argv, stdin=r, env=home.env,
                              capture_output=True, timeout=60)
    finally:
        os.close(r)
    return done


def subjects(home):
    return [q.mess.split(b"Subject: ")[1].split(b"\n")[0] for q in queued(home)]


@pytest.mark.parametrize("program", [["sendmail", "-t"], ["qmail-inject"]])
@pytest.mark.parametrize("close", [(1, 2), (2,), (1,)])
def test_closed_output_fds(qmail_home, program, close):
    tag = b"closed %r" % (close,)
    done = run_with(qmail_home, program, tag, close=close)
    assert done.returncode == 0, done
    assert subjects(qmail_home) == [tag]


@pytest.mark.parametrize("program,code", [(["sendmail", "-t"], 75), (["sendmail", "x@elsewhere.example"], 75),
                                          (["qmail-inject", "x@elsewhere.example"], 111)])
def test_closed_stdin_is_a_read_error_not_an_empty_message(qmail_home, program, code):
    done = run_with(qmail_home, program, b"x", close=(0,))
    assert done.returncode == code, done
    assert done.stderr == b"%s: fatal: unable to read message: standard input is closed\n" % (
        program[0].encode())
    assert subjects(qmail_home) == []
    everything = run_with(qmail_home, program, b"x", close=(0, 1, 2))   # nowhere to say why
    assert everything.returncode == code and everything.stderr == b""
    assert subjects(qmail_home) == []


@pytest.mark.parametrize("program", [["sendmail", "-t"], ["qmail-inject"]])
def test_an_ignored_sigchld_does_not_turn_success_into_a_retry(qmail_home, program):
    done = run_with(qmail_home, program, b"sigchld", ignore_sigchld=True)
    assert done.returncode == 0, done
    assert b"waitpid" not in done.stderr
    assert subjects(qmail_home) == [b"sigchld"]


@pytest.fixture
def busy_home(qmail_home):
    """A running home with 300 preprocessed, deferred messages: more output than a pipe holds."""
    home = qmail_home
    home.control("smtproutes", ":127.0.0.1:1\n")             # nothing listens: deferred
    for i in range(300):
        home.queue_message(b"Subject: %d\n\nx\n" % i, b"joe@test.example", [b"r%d@elsewhere.example" % i])
    assert home.run(["qmailctl", "start", "--home", home.path]).returncode == 0
    deadline = time.monotonic() + 60
    while b"preprocessed: 0" not in home.run(["qmail-qstat"]).stdout:
        assert time.monotonic() < deadline, "not preprocessed"
        time.sleep(0.1)
    yield home
    home.run(["qmailctl", "stop", "--home", home.path])


@pytest.mark.parametrize("argv", [["qmail-qread"], ["qmailctl", "stat"], ["qmailctl", "queue"]])
def test_a_reader_that_goes_away_gets_no_traceback(busy_home, argv):
    done = subprocess.run(["sh", "-c", '"$@" | head -1', "sh"] + argv, env=busy_home.env,
                          capture_output=True, timeout=120)
    assert b"Traceback" not in done.stderr, done.stderr
    assert done.stdout.count(b"\n") == 1


@pytest.mark.parametrize("command", ["start", "stat", "queue"])
def test_qmailctl_on_a_directory_that_is_not_a_home_says_so_and_creates_nothing(tmp_path, qmail_home, command):
    target = tmp_path / "not-a-home"
    done = qmail_home.run(["qmailctl", command, "--home", str(target)])
    assert (done.returncode, done.stdout, done.stderr) == (1, b"", (
        "qmailctl: %s is not a qmail home (make one with: qmailctl init --home %s)\n" % (target, target)).encode())
    assert not target.exists()


def test_a_failed_start_leaves_nothing_running(qmail_home):
    import psutil
    locals_path = os.path.join(qmail_home.path, "control", "locals")
    os.chmod(locals_path, 0)                    # qmail-send cannot read its controls
    try:
        done = qmail_home.run(["qmailctl", "start", "--home", qmail_home.path])
    finally:
        os.chmod(locals_path, 0o644)
    if done.returncode == 0:                    # the account reads it anyway: nothing to test
        qmail_home.run(["qmailctl", "stop", "--home", qmail_home.path])
        pytest.skip("control/locals stays readable for this account")
    assert b"qmail-send did not start" in done.stderr
    qmqpd_pid = os.path.join(qmail_home.path, "log", "qmail-qmqpd.pid")
    assert not os.path.exists(qmqpd_pid)
    started = [p for p in psutil.process_iter(["cmdline"])
               if any(qmail_home.path in a for a in (p.info["cmdline"] or []))
               and any("qmail-qmqpd" in a or "qmail-send" in a for a in p.info["cmdline"])]
    assert psutil.wait_procs(started, timeout=30)[1] == []
    stat = qmail_home.run(["qmailctl", "stat", "--home", qmail_home.path])
    assert b"Traceback" not in stat.stderr


@pytest.mark.parametrize("argv,said", [(["qmail-lspawn", "./Maildir/"], b"x"), (["qmail-rspawn"], b"x"),
                                       (["qmail-clean"], b"")])
def test_a_spawner_run_by_hand_with_stdin_on_dev_null_just_ends(qmail_home, argv, said):
    """End of input is qmail-send going away: the helper ends quietly with 0, after
    announcing its 120 slots (the byte x) as it would to qmail-send."""
    with open(os.devnull, "rb") as null:
        done = subprocess.run(argv, stdin=null, env=qmail_home.env, capture_output=True, timeout=60,
                              cwd=qmail_home.path)
    assert (done.returncode, done.stdout, done.stderr) == (0, said, b"")
