"""Who may submit, and as whom: every local user, with qmail's real accounts (root only).

On a home made by `qmailctl init` as root (the queue owned by qmailq), with qmail-qmqpd
running as qmailq: an ordinary user, a web server's account and root each submit
through `sendmail -t`, `qmail-inject` and `qmail-queue`. Each message is queued once,
and its `Received: (qmail PID invoked by uid N)` line names the submitter's real uid.
Nobody can claim another uid: what a client writes into a QMQP request does not
change the uid the server records, and a user without queue rights cannot write the
queue directly. Then qmail-smtpd under Debian's tcpserver, as qmaild:nofiles,
queues "from network" through the same server, and qmail-send delivers it to a
local user's Maildir.
"""
import os
import re
import shutil
import socket
import subprocess

import pytest

from accounts import gid, temporary_multiuser_home, uid
from delivery_support import wait_maildir
from qmqpd_harness import QmqpServer
from queue_view import queued
from send_harness import Daemons

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create accounts"),
              pytest.mark.both_backends]

SUBMITTERS = ("qtuser", "qtweb", "root")
RECEIVED = re.compile(rb"^Received: \(qmail (\d+) invoked (by uid (\d+)|from network)\);", re.M)


@pytest.fixture
def server(queue_backend):
    with temporary_multiuser_home(queue_backend) as home:
        with QmqpServer(home):
            yield home


def as_user(name):
    """subprocess arguments that run a command as account `name`, groups its own only."""
    if name == "root":
        return {}
    import pwd
    pw = pwd.getpwnam(name)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "cwd": "/"}


def submit(home, how, user, tag):
    to = b"someone@elsewhere.example"
    message = b"To: %s\nSubject: %s\n\nfrom %s\n" % (to, tag, user.encode())
    if how == "sendmail -t":
        argv, data, kw = ["sendmail", "-t"], message, {}
    elif how == "qmail-inject":
        argv, data, kw = ["qmail-inject"], message, {}
    else:
        env_r, env_w = os.pipe()
        os.write(env_w, b"F" + user.encode() + b"@test.example\0T" + to + b"\0\0")
        os.close(env_w)
        argv, data, kw = ["qmail-queue"], message, {"stdout": env_r}
    try:
        done = subprocess.run(argv, input=data, env=home.env, timeout=60,
                              stderr=subprocess.PIPE, **kw, **as_user(user))
    finally:
        if "stdout" in kw:
            os.close(kw["stdout"])
    return done


def received_uid(mess):
    m = RECEIVED.search(mess)
    assert m, mess[:300]
    return int(m.group(3)) if m.group(3) else "network"


def test_every_user_submits_with_each_program_and_is_named_by_its_uid(server):
    home = server
    expected = {}
    for user in SUBMITTERS:
        for how in ("sendmail -t", "qmail-inject", "qmail-queue"):
            tag = ("%s %s" % (user, how)).encode()
            done = submit(home, how, user, tag)
            assert done.returncode == 0, (user, how, done.stderr)
            expected[tag] = 0 if user == "root" else uid(user)
    got = {}
    for q in queued(home):
        tag = re.search(rb"^Subject: (.*)$", q.mess, re.M).group(1)
        assert tag not in got, "queued twice: %r" % tag
        got[tag] = received_uid(q.mess)
    assert got == expected


def test_a_client_cannot_claim_another_uid(server):
    home = server
    sock = os.path.join(home.path, "run", "qmqp.sock")
    forged = (b"Received: (qmail 1 invoked by uid 0); 1 Jan 2026 00:00:00 -0000\n"
              b"Subject: forged\n\nI am root\n")
    script = ("import sys; sys.path[:0] = %r\n"
              "from qmqpd_harness import ask, request\n"
              "sys.stdout.buffer.write(ask(%r, request(%r, b'root@test.example', [b'x@elsewhere.example'])))\n"
              % ([os.path.dirname(__file__)] + list(__import__("sys").path), sock, forged))
    done = subprocess.run([__import__("sys").executable, "-c", script], capture_output=True,
                          timeout=60, **as_user("qtuser"))
    assert done.stdout.startswith(b"Kok "), done
    (q,) = [q for q in queued(home) if b"Subject: forged" in q.mess]
    assert received_uid(q.mess) == uid("qtuser")           # the first Received line is the server's
    assert q.uid == uid("qtuser")
    # and no way around the server: the queue is not the user's to write
    probe = subprocess.run(["sh", "-c", "echo x > %s/queue/todo/1" % home.path],
                           capture_output=True, **as_user("qtuser"))
    assert probe.returncode != 0
    assert not os.path.exists(os.path.join(home.queue, "todo", "1"))


def test_an_ordinary_user_holds_his_own_message_with_deliver_after(server):
    """sendmail -O DeliverAfter= without queue rights: the hold goes to qmail-qmqpd in the
    local socket's notbefore= option and becomes the mess file's mtime."""
    import time
    from qmailpy.layout import SPLIT
    home = server
    before = int(time.time())
    done = subprocess.run(["sendmail", "-O", "DeliverAfter=+7200", "someone@elsewhere.example"],
                          input=b"Subject: later\n\nheld\n", env=home.env, timeout=60,
                          stderr=subprocess.PIPE, **as_user("qtuser"))
    assert (done.returncode, done.stderr) == (0, b"")
    (q,) = queued(home)
    assert received_uid(q.mess) == uid("qtuser")
    mtime = os.stat(os.path.join(home.queue, "mess", str(q.n % SPLIT), str(q.n))).st_mtime
    assert before + 7200 <= mtime <= time.time() + 7200


def local_user(home, name, account):
    """users/assign maps NAME to ACCOUNT, with a Maildir in a home that ACCOUNT owns; the Maildir."""
    import pwd
    pw = pwd.getpwnam(account)
    userhome = os.path.join(os.path.dirname(home.path), name)
    for path in (userhome, userhome + "/Maildir", userhome + "/Maildir/new",
                 userhome + "/Maildir/cur", userhome + "/Maildir/tmp"):
        os.mkdir(path, 0o700)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    path = os.path.join(home.path, "users", "assign")
    with open(path, "w") as f:
        f.write("=%s:%s:%d:%d:%s:::\n.\n" % (name, account, pw.pw_uid, pw.pw_gid, userhome))
    os.chmod(path, 0o644)
    return userhome + "/Maildir"


def test_qmail_smtpd_under_debians_tcpserver_queues_from_network_and_delivers(server):
    tcpserver = shutil.which("tcpserver")
    if tcpserver is None:
        pytest.skip("Debian's ucspi-tcp is not installed (bin/test installs it as root)")
    home = server
    maildir = local_user(home, "bench", "qtuser")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([tcpserver, "-v", "-R", "-H", "-u", str(uid("qmaild")), "-g", str(gid("nofiles")),
                             "127.0.0.1", str(port), "qmail-smtpd"], env=home.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert b"status: 0/40" in proc.stderr.readline()          # tcpserver is listening
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            f = c.makefile("rb")
            assert f.readline().startswith(b"220 ")
            for command, code in ((b"HELO client.example", b"250"), (b"MAIL FROM:<a@client.example>", b"250"),
                                  (b"RCPT TO:<bench@test.example>", b"250"), (b"DATA", b"354"),
                                  (b"Subject: over tcpserver\r\n\r\nhello\r\n.", b"250"), (b"QUIT", b"221")):
                c.sendall(command + b"\r\n")
                reply = f.readline()
                assert reply.startswith(code), (command, reply)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    (q,) = [q for q in queued(home) if b"Subject: over tcpserver" in q.mess]
    assert received_uid(q.mess) == "network"
    assert q.recipients == [b"bench@test.example"]
    daemons = Daemons(home).start()           # qmail-start as root: every daemon as its account
    try:
        (got,) = wait_maildir(maildir, 1)
    finally:
        daemons.kill()
    assert b"Subject: over tcpserver" in got
    assert RECEIVED.search(got).group(2) == b"from network"
    assert os.stat(os.path.join(maildir, "new", os.listdir(os.path.join(maildir, "new"))[0])).st_uid \
        == uid("qtuser")
