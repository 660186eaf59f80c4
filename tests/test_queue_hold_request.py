"""A hold asked at queueing (docs/queue-format.md "Hold at queueing"): qmail-queue's
$QMAILHOLD=1 and the local QMQP socket's "hold" option set the owner-execute bit of the
mess file, synced before the envelope is written; a running qmail-send turns it into its
own hold as it preprocesses the message (`hold msg N`, hold/N or the PREPROCESSED record's
held bit), delivers nothing of it, and `qmailctl queue release` lets it go."""
import os
import pwd
import re
import smtplib
import stat
import subprocess
import sys
import time

import pytest

from conftest import AS_ROOT
from ctl_support import free_port
from delivery_support import maildir_messages, wait_maildir
from lspawn_harness import LocalUsers
from qmqpd_harness import QmqpServer, ask, netstring, request
from queue_commands_support import ctl
from queue_view import queued
from send_harness import Daemons

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def mess_mode(home, n):
    return stat.S_IMODE(os.stat(os.path.join(home.queue, "mess", str(n % 23), str(n))).st_mode)


def starts_of(daemons, n):
    return [l for l in daemons.lines() if re.match(r"starting delivery \d+: msg %d " % n, l)]


def held_then_released(home, joe, held, free_subject):
    """With a message `free_subject` queued after the held one: qmail-send holds `held`,
    delivers the free one and nothing of `held`, until its release delivers it."""
    daemons = Daemons(home).start()
    try:
        daemons.wait_line(r"^hold msg %d$" % held)
        daemons.wait_line(r"^end msg ")
        assert starts_of(daemons, held) == []
        [got] = maildir_messages(os.path.join(joe, "Maildir"))
        assert b"Subject: %s\n" % free_subject in got
        listing = home.run(["qmailctl", "queue", "list", "--home", home.path, str(held)])
        assert re.search(rb"#%d  \d+  <a@b\.example>  held\n" % held, listing.stdout), listing.stdout
        assert ctl(home, "release", str(held)).stdout == b"%d: released\n" % held
        assert len(wait_maildir(os.path.join(joe, "Maildir"), 2)) == 2
        daemons.wait_line(r"^end msg %d$" % held)
        assert "release msg %d" % held in daemons.lines()
    finally:
        daemons.kill()


def test_qmailhold_queues_a_message_on_hold(qmail_home):
    joe = LocalUsers(qmail_home).add("joe")
    env = dict(qmail_home.env, QMAILHOLD="1")
    done = qmail_home.queue_message(b"Subject: held\n\nkept\n", b"a@b.example", [b"joe@test.example"], env)
    assert done.returncode == 0, done.stderr
    [msg] = queued(qmail_home)
    assert mess_mode(qmail_home, msg.n) == 0o744
    free = qmail_home.queue_message(b"Subject: free\n\nfree\n", b"a@b.example", [b"joe@test.example"])
    assert free.returncode == 0
    assert mess_mode(qmail_home, max(m.n for m in queued(qmail_home) if m.n != msg.n)) == 0o644
    held_then_released(qmail_home, joe, msg.n, b"free")


def test_a_bad_qmailhold_queues_nothing(qmail_home):
    for value in ("yes", "", "0"):
        env = dict(qmail_home.env, QMAILHOLD=value)
        done = qmail_home.queue_message(b"Subject: x\n\nx\n", b"a@b.example", [b"joe@test.example"], env)
        assert done.returncode == 55, value
    assert queued(qmail_home) == []


def test_the_local_socket_carries_a_hold(qmail_home):
    joe = LocalUsers(qmail_home).add("joe")
    with QmqpServer(qmail_home, "-t", "10") as server:
        held = request(b"Subject: held\n\nkept\n", b"a@b.example", [b"joe@test.example"], hold=True)
        assert held.startswith(netstring(b"hold"))
        assert ask(server.socket, held).startswith(b"Kok ")
        body = request(b"m\n", b"a@b.example", [b"joe@test.example"])
        twice = netstring(b"hold") + netstring(b"hold") + body
        assert ask(server.socket, twice) == b"Dthat is not a QMQP request (#5.5.2)"
        free = request(b"Subject: free\n\nfree\n", b"a@b.example", [b"joe@test.example"])
        assert ask(server.socket, free).startswith(b"Kok ")
    modes = {m.mess.split(b"Subject: ")[1][:4]: (m.n, mess_mode(qmail_home, m.n)) for m in queued(qmail_home)}
    assert {k: mode for k, (_, mode) in modes.items()} == {b"held": 0o744, b"free": 0o644}
    held_then_released(qmail_home, joe, modes[b"held"][0], b"free")


@pytest.mark.skipif(not AS_ROOT, reason="needs a local uid that is neither root nor the home's")
def test_an_ordinary_user_cannot_queue_on_hold(qmail_home, tmp_path):
    """A hold at queueing lasts until a release, longer than the longest not-before time
    an ordinary user may set (MAX_HOLD): qmail-qmqpd answers his `hold` as it answers such
    a not-before time, and nothing of it is queued; his message without it is."""
    other = 61018                       # neither root nor the home's one account
    with QmqpServer(qmail_home, "-t", "10"):
        def sendmail(env):
            return subprocess.run(["sendmail", "-f", "a@b.example", "joe@test.example"],
                                  input=b"Subject: x\n\nx\n", env=env, user=other,
                                  capture_output=True, timeout=60)
        held = sendmail(dict(qmail_home.env, QMAILHOLD="1"))
        assert held.returncode != 0
        assert b"sorry, that hold is longer than I allow (#5.5.4)" in held.stderr, held.stderr
        message, envelope = tmp_path / "message", tmp_path / "envelope"
        message.write_bytes(b"Subject: x\n\nx\n")
        envelope.write_bytes(b"Fa@b.example\0Tjoe@test.example\0\0")
        with open(message, "rb") as fd0, open(envelope, "rb") as fd1:
            direct = subprocess.run(["qmail-queue"], stdin=fd0, stdout=fd1, stderr=subprocess.PIPE,
                                    env=dict(qmail_home.env, QMAILHOLD="1"), user=other, timeout=60)
        assert direct.returncode == 31, direct.stderr
        assert queued(qmail_home) == []
        free = sendmail(qmail_home.env)
        assert free.returncode == 0, free.stderr
    [msg] = queued(qmail_home)
    assert (msg.uid, mess_mode(qmail_home, msg.n)) == (other, 0o644)


ASK_HELD = """
import socket, sys
from qmailpy.queue.qmqp import parse_answer, request
with socket.socket(socket.AF_UNIX) as s:
    s.connect(sys.argv[1])
    s.sendall(request(b"Subject: q\\n\\nq\\n", b"a@b.example", [b"joe@test.example"], hold=True))
    got = b""
    while parse_answer(got) is None:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
print(parse_answer(got).decode())
"""


@pytest.mark.skipif(not AS_ROOT, reason="only root can run the roles as other accounts")
def test_qmaild_queues_on_hold_where_the_queue_is_another_accounts(qmail_home):
    """On a server whose roles are separate accounts qmail-smtpd's sessions run as qmaild,
    not as the queue's owner: its quarantines still queue on hold through qmail-qmqpd."""
    owner = "daemon"
    roles = os.path.join(qmail_home.path, "control", "roles")
    with open(roles) as f:
        text = f.read()
    with open(roles, "w") as f:
        f.write(text.replace("qmailq:%s\n" % qmail_home.user, "qmailq:%s\n" % owner))
    done = qmail_home.run(["qmailctl", "init", "--home", qmail_home.path])
    assert done.returncode == 0, done.stderr
    assert os.stat(os.path.join(qmail_home.queue, "mess")).st_uid == pwd.getpwnam(owner).pw_uid
    assert "qmaild:%s\n" % qmail_home.user in text
    with QmqpServer(qmail_home, "-t", "10") as server:
        for uid, answer in ((qmail_home.uid, b"Kok "), (61018, b"Dsorry, that hold is longer")):
            got = subprocess.run([sys.executable, "-c", ASK_HELD, server.socket], user=uid,
                                 capture_output=True, timeout=60)
            assert got.stdout.startswith(answer), (uid, got.stdout, got.stderr)
    [msg] = queued(qmail_home)
    assert (msg.uid, mess_mode(qmail_home, msg.n)) == (qmail_home.uid, 0o744)


# qmail-send SIGKILLed at a point of preprocessing a held message (run by qmail-start,
# found first on PATH): "hold_written" right after the directory backend's hold/n is on
# disk, before todo/n goes; "preprocessed" once the backend has preprocessed the message
# (hold/n and no todo/n, or the PREPROCESSED record with its held bit), before qmail-send
# logs `hold msg` and hands the channels back.
KILLING_SEND = """#!%s
import os, signal, sys
from qmailpy.backends.dir.holds import DirHolds
from qmailpy.send.loop import QmailSend
hold = DirHolds.hold
def hold_then_die(self, n):
    hold(self, n)
    os.kill(os.getpid(), signal.SIGKILL)
def die(self, n, p):
    os.kill(os.getpid(), signal.SIGKILL)
if %r == "hold_written":
    DirHolds.hold = hold_then_die
else:
    QmailSend.preprocessed = die
from qmailpy.cli.qmail_send import main
sys.exit(main())
"""


@pytest.mark.parametrize("kill_at", ["hold_written", "preprocessed"])
def test_a_crash_while_preprocessing_a_held_message_keeps_it_held(qmail_home, queue_backend,
                                                                 kill_at, tmp_path):
    """SIGKILL once the hold is on disk (hold/n before todo/n goes; the backend's
    preprocessing done, `hold msg` not yet logged): the next qmail-send holds the message,
    starts no delivery of it, and delivers it on release."""
    if kill_at == "hold_written" and queue_backend == "log":
        pytest.skip("hold/n is the directory backend's")
    joe = LocalUsers(qmail_home).add("joe")
    env = dict(qmail_home.env, QMAILHOLD="1")
    assert qmail_home.queue_message(b"Subject: held\n\nkept\n", b"a@b.example",
                                    [b"joe@test.example"], env).returncode == 0
    [held] = [m.n for m in queued(qmail_home)]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "qmail-send").write_text(KILLING_SEND % (sys.executable, kill_at))
    os.chmod(bindir / "qmail-send", 0o755)
    os.chmod(tmp_path, 0o755)
    path = "%s:%s" % (bindir, qmail_home.env["PATH"])
    crashing = Daemons(qmail_home, env=dict(qmail_home.env, PATH=path))
    crashing.start()
    try:
        assert crashing.proc.wait(timeout=60) == -9
    finally:
        crashing.kill()
    assert starts_of(crashing, held) == []
    free = qmail_home.queue_message(b"Subject: free\n\nfree\n", b"a@b.example", [b"joe@test.example"])
    assert free.returncode == 0
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_line(r"^end msg ")                 # the free message, queued after the crash
        assert starts_of(daemons, held) == []
        [got] = maildir_messages(os.path.join(joe, "Maildir"))
        assert b"Subject: free\n" in got
        assert ("hold msg %d" % held in daemons.lines()) == (kill_at == "hold_written")
        assert ctl(qmail_home, "release", str(held)).stdout == b"%d: released\n" % held
        assert len(wait_maildir(os.path.join(joe, "Maildir"), 2)) == 2
        daemons.wait_line(r"^end msg %d$" % held)
    finally:
        daemons.kill()


def test_qmailctl_start_keeps_a_submissions_variables_from_the_daemons(qmail_home):
    """QMAILHOLD and QMAILNOTBEFORE ask something of one submission: left exported in the
    shell that runs `qmailctl start`, they must not hold every message qmail-smtpd queues
    (nor qmail-send's bounces and qmail-local's forwards) until a release or a day later."""
    joe = LocalUsers(qmail_home).add("joe")
    smtp = free_port()
    shell = dict(qmail_home.env, QMAILHOLD="1", QMAILNOTBEFORE="%d" % (time.time() + 86400))
    started = qmail_home.run(["qmailctl", "start", "--home", qmail_home.path,
                              "--smtp", "127.0.0.1:%d" % smtp], env=shell)
    try:
        assert started.returncode == 0, started.stderr
        with smtplib.SMTP("127.0.0.1", smtp, timeout=30) as s:
            s.sendmail("a@b.example", ["joe@test.example"], b"Subject: by smtp\r\n\r\nhi\r\n")
        [got] = wait_maildir(os.path.join(joe, "Maildir"), 1)
        assert b"Subject: by smtp\n" in got
    finally:
        stopped = qmail_home.run(["qmailctl", "stop", "--home", qmail_home.path])
    assert stopped.returncode == 0, stopped.stderr
