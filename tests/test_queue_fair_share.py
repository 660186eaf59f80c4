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
from test_smtpd_support import TIMEOUT, ListenerProcess

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
