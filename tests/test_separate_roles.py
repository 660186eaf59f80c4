"""A home whose roles are separate accounts, as on a real mail server (run as root only).

qmail-send runs as qmails and qmail-local as the recipient, but their bounces and
forwards must be written into the queue, which qmailq owns (pid/, mess/, intd/,
todo/). qmail gets there through its setuid qmail-queue; qmailpy through the queue
server qmail-qmqpd, which runs as qmailq and queues for the uid the kernel names.
"""
import os
import pwd
import subprocess

import pytest

from delivery_support import maildir_messages, queue, wait_maildir
from lspawn_harness import LocalUsers
from qmqpd_harness import QmqpServer
from send_harness import Daemons

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="only root can run the roles as other accounts"),
              pytest.mark.both_backends]

QUEUE_OWNER = "daemon"          # any account but the fixture's own: qmailq here


@pytest.fixture
def separate_home(qmail_home):
    try:
        pwd.getpwnam(QUEUE_OWNER)
    except KeyError:
        pytest.skip("no %s account" % QUEUE_OWNER)
    roles = os.path.join(qmail_home.path, "control", "roles")
    with open(roles) as f:
        text = f.read().replace("qmailq:%s\n" % qmail_home.user, "qmailq:%s\n" % QUEUE_OWNER)
    with open(roles, "w") as f:
        f.write(text)
    done = subprocess.run(["qmailctl", "init", "--home", qmail_home.path], env=qmail_home.env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for directory in ("control", "users"):      # no longer a single-user home: root owns them
        for name in os.listdir(os.path.join(qmail_home.path, directory)):
            os.chown(os.path.join(qmail_home.path, directory, name), 0, 0)
    check = subprocess.run(["qmailctl", "check", "--home", qmail_home.path], env=qmail_home.env,
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    mess = os.path.join(qmail_home.queue, "mess")
    assert os.stat(mess).st_uid == pwd.getpwnam(QUEUE_OWNER).pw_uid
    return qmail_home


def test_bounce_and_forward_are_queued_as_qmailq(separate_home):
    users = LocalUsers(separate_home)
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    users.dotqmail(bench, "-fwd", "&bench@test.example\n")
    daemons = Daemons(separate_home)
    server = QmqpServer(separate_home).start()
    try:
        daemons.start()
        daemons.wait_line(r"^status: ")
        queue(separate_home, b"bench@test.example", [b"nosuchuser@test.example"])
        queue(separate_home, b"joe@far.example", [b"bench-fwd@test.example"])
        daemons.wait_line(r"^end msg ", 4)
        got = wait_maildir(os.path.join(bench, "Maildir"), 2)
    finally:
        daemons.kill()
        server.stop()
    lines = daemons.lines()
    assert not [l for l in lines if "qmail-clean unable" in l or "unable to inject" in l], lines
    bounce = [m for m in got if b"Subject: failure notice\n" in m]
    forward = [m for m in got if b"Delivered-To: bench-fwd@test.example\n" in m]
    assert len(bounce) == 1 and len(forward) == 1, maildir_messages(os.path.join(bench, "Maildir"))
    assert not [l for l in lines if ": deferral: " in l], lines     # qmail-local's forward queued


def test_databytes_stops_neither_bounces_nor_forwards(separate_home):
    """control/databytes bounds SMTP (and QMQP from the network) only, as in qmail: a bounce
    carrying a 2.7 kB message and a forward of a 3.1 kB one are queued under databytes 3000."""
    separate_home.control("databytes", "3000\n")
    users = LocalUsers(separate_home)
    bench = users.add("bench")
    users.add("bench-", home=bench, dash="-", wildcard=True)
    users.dotqmail(bench, "-fwd", "&bench@test.example\n")
    daemons = Daemons(separate_home)
    server = QmqpServer(separate_home).start()
    try:
        daemons.start()
        daemons.wait_line(r"^status: ")
        queue(separate_home, b"bench@test.example", [b"nosuchuser@test.example"],
              b"Subject: to bounce\n\n" + b"b" * 2700 + b"\n")
        queue(separate_home, b"joe@far.example", [b"bench-fwd@test.example"],
              b"Subject: to forward\n\n" + b"f" * 3100 + b"\n")
        daemons.wait_line(r"^end msg ", 4)
        got = wait_maildir(os.path.join(bench, "Maildir"), 2)
    finally:
        daemons.kill()
        server.stop()
    lines = daemons.lines()
    assert not [l for l in lines if "trouble injecting bounce" in l or "databytes" in l], lines
    bounce = [m for m in got if b"Subject: failure notice\n" in m and b"b" * 2700 in m]
    forward = [m for m in got if b"Delivered-To: bench-fwd@test.example\n" in m and b"f" * 3100 in m]
    assert len(bounce) == 1 and len(forward) == 1, maildir_messages(os.path.join(bench, "Maildir"))
