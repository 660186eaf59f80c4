"""qmail-send through qmail-start, with small stand-in spawners (tests/send_harness.py).

What is checked is what an operator sees: the log lines, the queue files and
their mtimes, the commands the spawners receive and the bounce bytes.
"""
import math
import os
import re
import signal
import subprocess

import pytest

from qmailpy.send.bounce import bounce_message
from queue_view import leftovers
from send_harness import Daemons, run_send_alone, wait_mess_gone

pytestmark = pytest.mark.slow

MSG = b"Subject: test\n\nhello\n"


@pytest.fixture
def daemons(qmail_home):
    d = Daemons(qmail_home, fake=True)
    yield d
    d.kill()


def queue(home, sender, recipients, message=MSG):
    done = home.queue_message(message, sender, recipients)
    assert done.returncode == 0, done.stderr
    return done


def new_msgs(lines):
    return [int(l.split()[2]) for l in lines if l.startswith("new msg ")]


def queue_files(home):
    """What the queue still holds, on either backend (queue_view.leftovers)."""
    return leftovers(home)


@pytest.mark.both_backends
def test_startup_status_line_and_four_daemons(qmail_home, daemons):
    daemons.start()
    lines = daemons.wait_line(r"^status: ")
    assert lines[0] == "status: local 0/10 remote 0/20"
    procs = daemons.daemons()
    assert {"qmail-send", "qmail-lspawn", "qmail-rspawn", "qmail-clean"} <= set(procs)
    # as root each daemon switches to its role's account (all the home's user here) and
    # qmail-lspawn stays root; as anyone else nobody switches
    root = os.geteuid() == 0
    for name in ("qmail-send", "qmail-rspawn", "qmail-clean"):
        assert procs[name].uids().effective == qmail_home.uid, name
    assert procs["qmail-lspawn"].uids().effective == (0 if root else qmail_home.uid)
    assert daemons.stop() == 0
    assert daemons.lines()[-1] == "status: exiting"


@pytest.mark.both_backends
def test_local_and_remote_delivery_log_sequence(qmail_home, daemons):
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@test.example", [b"bob@test.example", b"ann@far.example"])
    lines = daemons.wait_line(r"^end msg ")
    n = new_msgs(lines)[0]
    size = os.path.getsize(os.path.join(daemons.home.path, "..", "work",
                                        "msg-%d_%d-bob@test.example" % (n % 23, n)))
    body = [l for l in lines[1:] if not l.startswith("status:")]
    qp_uid = re.match(r"info msg \d+: bytes \d+ from <joe@test.example> qp (\d+) uid (\d+)$", body[1])
    assert qp_uid, body
    assert body[:2] == [
        "new msg %d" % n,
        "info msg %d: bytes %d from <joe@test.example> qp %s uid %s" % (n, size, qp_uid.group(1),
                                                                           qp_uid.group(2)),
    ]
    # the two deliveries run at once: their start and result lines may interleave
    assert sorted(body[2:6]) == [
        "delivery 1: success: did_1+0+0/",
        "delivery 2: success: did_1+0+0/",
        "starting delivery 1: msg %d to local bob@test.example" % n,
        "starting delivery 2: msg %d to remote ann@far.example" % n,
    ]
    assert body[2] == "starting delivery 1: msg %d to local bob@test.example" % n
    assert body[6:] == ["end msg %d" % n]
    statuses = [l for l in lines if l.startswith("status:")]
    assert statuses[0] == statuses[-1] == "status: local 0/10 remote 0/20"
    assert len(statuses) == 5           # startup, after each start, after each result
    with open(daemons.commands, "rb") as f:
        commands = f.read().splitlines()
    assert sorted(commands) == sorted([b"0 %d/%d joe@test.example bob@test.example" % (n % 23, n),
                                       b"0 %d/%d joe@test.example ann@far.example" % (n % 23, n)])
    wait_mess_gone(qmail_home, n)
    assert queue_files(qmail_home) == []


@pytest.mark.both_backends
def test_failure_bounces_to_sender_byte_exact(qmail_home, daemons):
    qmail_home.control("bouncehost", "bounce.test.example")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@far.example", [b"fail-1@test.example", b"ok@test.example"])
    lines = daemons.wait_line(r"^end msg ", 2)
    n, b = new_msgs(lines)[:2]
    bounce_line = [l for l in lines if l.startswith("bounce msg")]
    qp = int(bounce_line[0].split()[-1])
    assert bounce_line == ["bounce msg %d qp %d" % (n, qp)]
    assert "delivery 1: failure: failed_by_the_fake_spawner/second_line/" in lines
    assert re.search(r"^info msg %d: bytes \d+ from <> qp %d uid \d+$" % (b, qp),
                     "\n".join(lines), re.M)
    assert lines.index(bounce_line[0]) < lines.index("end msg %d" % n) < lines.index("new msg %d" % b)
    work = os.path.join(os.path.dirname(qmail_home.path), "work")
    with open(os.path.join(work, "msg-%d_%d-ok@test.example" % (n % 23, n)), "rb") as f:
        original = f.read()
    with open(os.path.join(work, "msg-%d_%d-joe@far.example" % (b % 23, b)), "rb") as f:
        received, bounced = f.read().split(b"\n", 1)
    assert received.startswith(b"Received: (qmail %d invoked " % qp)
    date = re.search(rb"^Date: (.*)$", bounced, re.M).group(1)
    import calendar
    import time
    when = calendar.timegm(time.strptime(date.decode(), "%d %b %Y %H:%M:%S -0000"))
    notes = b"<fail-1@test.example>:\nfailed by the fake spawner\nsecond line\n\n"
    assert bounced == bounce_message(b"joe@far.example", b"joe@far.example", b"MAILER-DAEMON",
                                     b"bounce.test.example", notes, original, when)
    with open(daemons.commands, "rb") as f:
        assert b"0 %d/%d - joe@far.example" % (b % 23, b) in f.read()


@pytest.mark.both_backends
def test_double_and_triple_bounces(qmail_home, daemons):
    qmail_home.control("doublebounceto", "dbl")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"", [b"fail-a@test.example"])
    lines = daemons.wait_line(r"^end msg ", 2)
    n, b = new_msgs(lines)[:2]
    assert re.search(r"^info msg %d: bytes \d+ from <#@\[\]> qp \d+ uid \d+$" % b, "\n".join(lines), re.M)
    assert "starting delivery 2: msg %d to local dbl@test.example" % b in lines
    work = os.path.join(os.path.dirname(qmail_home.path), "work")
    with open(os.path.join(work, "msg-%d_%d-dbl@test.example" % (b % 23, b)), "rb") as f:
        text = f.read()
    assert b"\nTo: dbl@test.example\n" in text
    assert b"I tried to deliver a bounce message to this address, but the bounce bounced!\n\n" in text
    assert b"--- Below this line is the original bounce.\n\nReturn-Path: <>\n" in text
    with open(daemons.commands, "rb") as f:
        assert b" #@[] dbl@test.example" in f.read()
    queue(qmail_home, b"#@[]", [b"fail-b@test.example"])
    lines = daemons.wait_line(r"^end msg ", 3)
    t = new_msgs(lines)[2]
    i = lines.index("triple bounce: discarding bounce/%d" % t)
    assert lines[i + 1] == "end msg %d" % t
    assert len(new_msgs(daemons.wait_line(r"^end msg ", 3))) == 3
    for m in (n, b, t):
        wait_mess_gone(qmail_home, m)
    assert queue_files(qmail_home) == []


def retry_due(birth, now, skip):
    return birth + (math.isqrt(max(0, now - birth)) + skip) ** 2


@pytest.mark.dir_only       # reads and edits info/, remote/, todo/ files
def test_deferral_schedule_alarm_and_restart(qmail_home, daemons):
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@test.example", [b"defer-1@far.example", b"done@far.example"])
    lines = daemons.wait_line(r"deferral: deferred_by_the_fake_spawner/")
    n = new_msgs(lines)[0]
    remote = os.path.join(qmail_home.queue, "remote", str(n % 23), str(n))
    info = os.path.join(qmail_home.queue, "info", str(n % 23), str(n))
    birth = int(os.stat(info).st_mtime)
    daemons.wait_line(r"^delivery 2: ")
    # the pass closes after both results; the retry time is then on the file
    daemons.wait_for(lambda _: int(os.stat(remote).st_mtime) >= birth + 400, what="remote mtime moved")
    mtime = int(os.stat(remote).st_mtime)
    assert mtime in {retry_due(birth, birth + k, 20) for k in range(0, 30)}
    assert mtime >= birth + 400
    with open(remote, "rb") as f:
        assert f.read() == b"Tdefer-1@far.example\0Ddone@far.example\0"
    daemons.signal(signal.SIGALRM)
    daemons.wait_line(r"^starting delivery 3: msg %d to remote defer-1@far.example$" % n)
    daemons.wait_line(r"^delivery 3: deferral: ")
    assert daemons.stop() == 0
    assert daemons.lines()[-1] == "status: exiting"
    mtime = int(os.stat(remote).st_mtime)
    assert mtime >= birth + 400 and os.stat(remote).st_atime == mtime
    # a restart honours the saved schedule: nothing is attempted until SIGALRM. A new
    # message's whole life (its passes run with the deferred one's) shows the loop has
    # looked at the schedule more than once by then.
    again = Daemons(qmail_home, fake=True)
    again.start()
    try:
        start = again.offset_of_start
        again.wait_started()
        queue(qmail_home, b"joe@test.example", [b"bob@test.example"])
        again.wait_for(lambda lines: any(l.startswith("end msg ") for l in lines[start:]),
                       what="the new message's end msg")
        assert not any(l.startswith("starting delivery") and "defer-1@far.example" in l
                       for l in again.lines()[start:])
        again.signal(signal.SIGALRM)
        again.wait_line(r"^starting delivery \d+: msg %d to remote defer-1@far.example$" % n)
        assert not any("done@far.example" in l for l in again.lines()[start:])
    finally:
        again.kill()


@pytest.mark.dir_only       # reads and edits info/, remote/, todo/ files
def test_mangled_report_and_garbage_in_queue_files(qmail_home, daemons):
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@test.example", [b"mangle@far.example"])
    lines = daemons.wait_line(r"report mangled, will defer$")
    n = new_msgs(lines)[0]
    assert "delivery 1: report mangled, will defer" in lines
    assert daemons.stop() == 0
    remote = os.path.join(qmail_home.queue, "remote", str(n % 23), str(n))
    with open(remote, "wb") as f:
        f.write(b"Xgarbage\0Tmangle@far.example\0")
    queue(qmail_home, b"joe@test.example", [b"bob@test.example"])
    todo = [name for name in os.listdir(os.path.join(qmail_home.queue, "todo"))]
    assert len(todo) == 1
    with open(os.path.join(qmail_home.queue, "todo", todo[0]), "ab") as f:
        f.write(b"Zjunk\0")
    again = Daemons(qmail_home, fake=True)
    again.start()
    try:
        start = again.offset_of_start
        lines = again.wait_line(r"^warning: unknown record type in todo/%s$" % todo[0])[start:]
        # as in qmail, `new msg` (and `info msg`: the junk follows the sender) come
        # before the warning, while the entry is being read
        warned = lines.index("warning: unknown record type in todo/%s" % todo[0])
        assert lines[warned - 2] == "new msg %s" % todo[0]
        assert re.match(r"info msg %s: bytes \d+ from <joe@test.example> qp \d+ uid \d+$" % todo[0],
                        lines[warned - 1])
        again.signal(signal.SIGALRM)
        again.wait_line(r"^warning: unknown record type in remote/%d/%d!$" % (n % 23, n))
        # SIGALRM rescans todo/ too: the garbage entry is announced again
        again.wait_line(r"^warning: unknown record type in todo/%s$" % todo[0], count=2)
        # the daemon lives on: a good message still goes through
        queue(qmail_home, b"joe@test.example", [b"carol@test.example"])
        again.wait_line(r"^starting delivery \d+: msg \d+ to local carol@test.example$")
        again.wait_line(r"^end msg ")
        # carol's trigger rescanned todo/: the garbage entry is announced a third time
        # (or more: on a slow machine the entry's own retry may come round first)
        lines = again.lines()[start:]
        announced = lines.count("new msg %s" % todo[0])
        assert announced >= 3
        assert lines.count("warning: unknown record type in todo/%s" % todo[0]) == announced
        third = [i for i, l in enumerate(lines) if l == "new msg %s" % todo[0]][2]
        assert "warning: unknown record type in todo/%s" % todo[0] in lines[third:]
        assert again.daemons().keys() >= {"qmail-send", "qmail-clean"}
        assert os.path.exists(os.path.join(qmail_home.queue, "todo", todo[0]))
        assert again.stop() == 0
    finally:
        again.kill()


@pytest.mark.both_backends
def test_second_qmail_send_refuses_to_start(qmail_home, daemons):
    daemons.start()
    daemons.wait_line(r"^status: ")
    r, w = os.pipe()
    try:
        proc = subprocess.run(["qmail-send"], stdin=w, stdout=subprocess.DEVNULL, env=qmail_home.env,
                              timeout=60)
        os.close(w)
        w = None
        out = os.read(r, 4096)
    finally:
        os.close(r)
        if w is not None:
            os.close(w)
    assert proc.returncode == 111
    assert out == b"alert: cannot start: qmail-send is already running\n"


@pytest.mark.both_backends
def test_no_spawners_and_missing_controls(qmail_home):
    assert run_send_alone(qmail_home) == (111, b"alert: cannot start: hath the daemon spawn no fire?\n")
    os.unlink(os.path.join(qmail_home.path, "control", "locals"))
    os.unlink(os.path.join(qmail_home.path, "control", "me"))
    assert run_send_alone(qmail_home) == (111, b"alert: cannot start: unable to read controls\n")


@pytest.mark.both_backends
def test_sighup_rereads_locals_and_virtualdomains(qmail_home, daemons):
    daemons.start()
    daemons.wait_line(r"^status: ")
    qmail_home.control("locals", "test.example\nnew.example\n")
    qmail_home.control("virtualdomains",
                       "virt.example:vuser\nVIRT.example:vuser2\nnot.example:\n.sub.example:subuser\n")
    daemons.signal(signal.SIGHUP)
    # SIGHUP is handled before the next select; the trigger from qmail-queue wakes the loop
    queue(qmail_home, b"joe@test.example",
          [b"a@NEW.example", b"b@virt.example", b"c@not.example", b"fail-x@virt.example",
           b"d@a.sub.example", b"e@sub.virt.example"])
    lines = daemons.wait_line(r"^end msg ", 2)
    n = new_msgs(lines)[0]
    assert "starting delivery 1: msg %d to local a@NEW.example" % n in lines
    assert "starting delivery 2: msg %d to local vuser2-b@virt.example" % n in lines
    assert "starting delivery 3: msg %d to local vuser2-fail-x@virt.example" % n in lines
    assert "starting delivery 4: msg %d to local subuser-d@a.sub.example" % n in lines
    assert "starting delivery 5: msg %d to remote c@not.example" % n in lines
    assert "starting delivery 6: msg %d to remote e@sub.virt.example" % n in lines
    b = new_msgs(lines)[1]
    work = os.path.join(os.path.dirname(qmail_home.path), "work")
    with open(os.path.join(work, "msg-%d_%d-joe@test.example" % (b % 23, b)), "rb") as f:
        assert b"\n<fail-x@virt.example>:\nfailed by the fake spawner\n" in f.read()


@pytest.mark.dir_only       # reads and edits info/, remote/, todo/ files
def test_dying_message_fails_instead_of_deferring(qmail_home, daemons):
    qmail_home.control("queuelifetime", "100")
    daemons.start()
    daemons.wait_line(r"^status: ")
    queue(qmail_home, b"joe@test.example", [b"defer-2@far.example"])
    lines = daemons.wait_line(r"^delivery 1: deferral: ")
    n = new_msgs(lines)[0]
    assert daemons.stop() == 0
    info = os.path.join(qmail_home.queue, "info", str(n % 23), str(n))
    old = os.stat(info).st_mtime - 101
    os.utime(info, (old, old))
    again = Daemons(qmail_home, fake=True)
    again.start()
    try:
        again.wait_started()
        again.signal(signal.SIGALRM)
        lines = again.wait_line(r"^bounce msg %d " % n)
        assert ("delivery 1: failure: deferred_by_the_fake_spawner/I'm_not_going_to_try_again;"
                "_this_message_has_been_in_the_queue_too_long./") in lines
    finally:
        again.kill()


@pytest.mark.both_backends
def test_logger_arguments_receive_the_log(qmail_home):
    from send_harness import shared_dir, write_fake_spawners
    from inotify_simple import INotify, flags
    import time
    bindir, _ = write_fake_spawners(qmail_home)
    work = shared_dir(qmail_home, "work")
    out = os.path.join(work, "logger.out")
    env = dict(qmail_home.env, PATH=bindir + os.pathsep + qmail_home.env["PATH"])
    proc = subprocess.Popen(["qmail-start", "./Maildir/", "/bin/sh", "-c", "exec cat > %s" % out],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, cwd="/",
                            start_new_session=True)
    try:
        with INotify() as ino:
            ino.add_watch(work, flags.CREATE | flags.MODIFY)
            deadline = time.monotonic() + 30
            while not (os.path.exists(out) and b"status: local 0/10 remote 0/20\n" in open(out, "rb").read()):
                assert time.monotonic() < deadline, "the logger got nothing"
                ino.read(timeout=1000)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
