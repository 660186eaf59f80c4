"""qmaild's hand-off always finds a queueing worker, however many connections other clients
hold open on qmail-qmqpd (issue 23 point 4; qmail-qmqpd(8) -r; workerserver "reserved").

-c 4 gives one reserved worker (a quarter) and three shared ones, at most two per client.
Two clients each open four silent connections: three of them get workers, the rest
wait in qmail-qmqpd's line holding none. An SMTP message must still get its 250 within
a second. As root the two clients are two local uids (SO_PEERCRED); as any user, two TCP
addresses (QMQP over TCP counts per address), which shows the same reservation."""
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import AS_ROOT
from qmqpd_harness import QmqpServer
from queue_view import queued
from smtpd_support import TIMEOUT, ListenerProcess

pytestmark = pytest.mark.slow

SILENT = 4          # connections each hostile client opens
SHARED = 3          # workers they may hold in all with -c 4


def wait_for_workers(server, count):
    """Until qmail-qmqpd has `count` workers (each holding a silent connection)."""
    deadline = time.monotonic() + TIMEOUT
    while len(psutil.Process(server.proc.pid).children()) < count:
        assert time.monotonic() < deadline, "the silent connections never reached workers"
        time.sleep(0.01)


def smtp_seconds(port):
    """Seconds from the end of DATA to the 250 of one SMTP message."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        f = sock.makefile("rb")
        assert f.readline().startswith(b"220")
        sock.sendall(b"HELO c\r\nMAIL FROM:<a@client.example>\r\nRCPT TO:<b@test.example>\r\nDATA\r\n")
        for _ in range(3):
            assert f.readline().startswith(b"250")
        assert f.readline().startswith(b"354")
        start = time.monotonic()
        sock.sendall(b"Subject: hi\r\n\r\nstill served\r\n.\r\n")
        reply = f.readline()
        seconds = time.monotonic() - start
        assert reply.startswith(b"250 ok "), reply
        sock.sendall(b"QUIT\r\n")
    return seconds


def assert_smtp_served(home, server):
    wait_for_workers(server, SHARED)
    with ListenerProcess(home) as listener:
        seconds = smtp_seconds(listener.port)
    assert seconds < 1.0, "the SMTP hand-off waited %.1f s for a queueing worker" % seconds
    assert [m.recipients for m in queued(home)] == [[b"b@test.example"]]


def test_two_tcp_clients_holding_silent_connections_leave_qmaild_a_worker(qmail_home):
    qmail_home.control("qmqpclients", "127.:allow\n")
    with QmqpServer(qmail_home, "-c", "4", "-t", "60", "--tcp", "127.0.0.1:0") as server:
        held = []
        try:
            for source in ("127.0.0.2", "127.0.0.3"):
                for _ in range(SILENT):
                    held.append(socket.create_connection(server.tcp, timeout=TIMEOUT,
                                                         source_address=(source, 0)))
            assert_smtp_served(qmail_home, server)
        finally:
            for sock in held:
                sock.close()


HOLD = r"""
import socket, sys
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    socks.append(s)
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not AS_ROOT, reason="needs two more local uids")
def test_two_local_uids_holding_silent_connections_leave_qmaild_a_worker(qmail_home):
    with QmqpServer(qmail_home, "-c", "4", "-t", "60") as server:
        holders = [subprocess.Popen([sys.executable, "-c", HOLD, server.socket, str(SILENT)],
                                    user=uid, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                   for uid in (61031, 61032)]
        try:
            for holder in holders:
                assert holder.stdout.readline() == b"held\n"
            assert_smtp_served(qmail_home, server)
        finally:
            for holder in holders:
                holder.stdin.close()
                holder.wait(timeout=TIMEOUT)


# Holds `count` silent connections and opens a new one the moment the server drops one
HOSTILE = r"""
import selectors, socket, sys
path, count = sys.argv[1], int(sys.argv[2])
sel = selectors.DefaultSelector()
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    sel.register(s, selectors.EVENT_READ)
for _ in range(count):
    connect()
print("held", flush=True)
sel.register(sys.stdin, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is sys.stdin:
            sys.exit(0)
        sel.unregister(key.fileobj)
        key.fileobj.close()
        connect()
"""


@pytest.mark.skipif(not AS_ROOT, reason="needs three more local uids")
def test_two_uids_holding_every_shared_worker_cannot_keep_a_third_waiting(qmail_home):
    """Two hostile uids take every shared worker (half each of -c 8's six) with silent
    connections and reconnect the moment one is dropped; a third ordinary uid's sendmail
    still gets its message queued within seconds, not after the 1200 s read timeout: a
    local request must arrive at LOCAL_PACE, and the freed worker goes to the oldest in line."""
    from qmailpy.queue.server import LOCAL_PACE
    with QmqpServer(qmail_home, "-c", "8", "-t", "1200") as server:
        holders = [subprocess.Popen([sys.executable, "-c", HOSTILE, server.socket, "3"], user=uid,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                   for uid in (61034, 61035)]
        try:
            for holder in holders:
                assert holder.stdout.readline() == b"held\n"
            wait_for_workers(server, 6)
            start = time.monotonic()
            done = subprocess.run(["setpriv", "--reuid=61036", "--regid=61036", "--clear-groups",
                                   "sendmail", "-f", "a@test.example", "b@test.example"],
                                  env=qmail_home.env, input=b"Subject: hi\n\nserved\n",
                                  capture_output=True, timeout=120)
            seconds = time.monotonic() - start
            assert done.returncode == 0, done.stderr
            assert seconds < 2 * LOCAL_PACE[0], "sendmail waited %.1f s for a worker" % seconds
            assert [m.recipients for m in queued(qmail_home)] == [[b"b@test.example"]]
        finally:
            for holder in holders:
                holder.stdin.close()
                holder.wait(timeout=TIMEOUT)


def test_a_request_that_falls_behind_its_pace_is_cut_off():
    """As any user (whose uid is qmaild's here, never paced): the reading side of the pace.
    A silent client is cut off once the grace has passed, a trickling one once it falls
    behind grace + bytes / rate; a client that keeps up is read to the end."""
    from qmailpy.queue.server import R_SLOW, BadRequest, Request
    a, b = socket.socketpair()
    with a, b:
        request = Request(a, time.monotonic() + 1200, pace=(0.3, 1000))
        start = time.monotonic()
        with pytest.raises(BadRequest) as cut:
            request._recv()
        assert cut.value.answer == R_SLOW and 0.25 < time.monotonic() - start < 5
    a, b = socket.socketpair()
    with a, b:
        request = Request(a, time.monotonic() + 1200, pace=(0.3, 1000))
        b.sendall(b"x" * 500)                  # earns half a second more
        assert request._recv() == b"x" * 500
        with pytest.raises(BadRequest):
            request._recv()
        assert 0.7 < time.monotonic() - request.started < 5
    a, b = socket.socketpair()
    with a, b:
        request = Request(a, time.monotonic() + 1200, pace=(0.3, 1000))
        b.sendall(b"y" * 100000)
        got = b""
        while len(got) < 100000:
            got += request._recv()
