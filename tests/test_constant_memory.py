"""A message of any size passes through qmail-smtpd and the queue socket in bounded memory
(docs/submission.md "Handing a message to qmail-qmqpd"; issue 23 point 3).

Each process's peak RSS is its VmHWM in /proc/PID/status. The 200 MB are generated
while they are sent, so the test itself stays small too."""
import glob
import os
import socket
import subprocess
import sys

import psutil

import pytest

from qmqpd_harness import QmqpServer
from smtpd_support import ListenerProcess

pytestmark = pytest.mark.slow

TIMEOUT = 120
MB = 1 << 20
CEILING_MB = 100
LINE = b"x" * 74 + b"\r\n"
BLOCK = LINE * (MB // len(LINE))


def peak_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM for %d" % pid)


def children_peak_mb(pid):
    return max(peak_mb(child.pid) for child in psutil.Process(pid).children())


def queued_sizes(home):
    return sorted(os.path.getsize(p) for p in glob.glob(os.path.join(home.path, "queue", "mess", "*", "*")))


class Replies:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def last(self, count):
        line = None
        while count:
            while b"\n" not in self.buf:
                data = self.sock.recv(65536)
                assert data, self.buf
                self.buf += data
            line, _, self.buf = self.buf.partition(b"\n")
            if line[3:4] == b" ":
                count -= 1
        return line


def test_a_200_mb_data_leaves_the_session_worker_and_the_queue_worker_small(qmail_home):
    qmail_home.control("databytes", "0\n")
    with QmqpServer(qmail_home), ListenerProcess(qmail_home) as listener:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT) as sock:
            replies = Replies(sock)
            replies.last(1)
            sock.sendall(b"HELO client\r\nMAIL FROM:<a@client.example>\r\nRCPT TO:<b@test.example>\r\nDATA\r\n")
            assert replies.last(4).startswith(b"354")
            sock.sendall(b"Subject: large\r\n\r\n")
            for _ in range(200):
                sock.sendall(BLOCK)
            sock.sendall(b".\r\n")
            assert replies.last(1).startswith(b"250 ok ")
        session_peak = children_peak_mb(listener.proc.pid)
    assert session_peak < CEILING_MB, "session worker peaked at %d MB" % session_peak
    sizes = queued_sizes(qmail_home)
    assert len(sizes) == 1 and sizes[0] > 200 * len(BLOCK) * 73 // 76


# The client's own peak is VmHWM, not getrusage's ru_maxrss: Linux carries the forking
# parent's high-water mark across exec into ru_maxrss, so a late pytest worker's size
# (151 MB in one CI run) would be reported as the client's.
LOCAL_CLIENT = r"""
import sys
from qmailpy.queue.client import ServerSubmission
block = (b"x" * 75 + b"\n") * (1048576 // 76)
s = ServerSubmission(sys.argv[1])
s.write(b"Subject: large\n\n")
for _ in range(int(sys.argv[2])):
    s.write(block)
r = s.finish(b"a@test.example", [b"b@test.example"])
print(r.code, [int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0], r.text.decode())
"""


def submit_locally(home, megabytes, **env):
    done = subprocess.run([sys.executable, "-c", LOCAL_CLIENT, home.path, str(megabytes)],
                          env=dict(home.env, **env), capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    code, peak, text = done.stdout.decode().rstrip("\n").split(" ", 2)
    return int(code), int(peak), text


def test_a_200_mb_local_submission_through_the_socket_stays_small(qmail_home):
    with QmqpServer(qmail_home) as server:
        code, client_peak, text = submit_locally(qmail_home, 200)
        assert code == 0, text
        server_peak = children_peak_mb(server.proc.pid)
    assert client_peak < CEILING_MB, "the client peaked at %d MB" % client_peak
    assert server_peak < CEILING_MB, "the queueing worker peaked at %d MB" % server_peak
    sizes = queued_sizes(qmail_home)
    assert len(sizes) == 1 and sizes[0] > 200 * MB * 75 // 76


def test_a_large_message_that_cannot_be_spooled_is_refused_and_nothing_is_queued(qmail_home):
    with QmqpServer(qmail_home):
        code, _, text = submit_locally(qmail_home, 2, TMPDIR="/nonexistent-spool-dir")
        assert code == 53
        assert "unable to spool the message in /nonexistent-spool-dir" in text
        code, _, text = submit_locally(qmail_home, 0, TMPDIR="/nonexistent-spool-dir")
        assert code == 0, text      # a small message is held in memory: no file needed
    assert len(queued_sizes(qmail_home)) == 1


def test_a_spooled_message_is_queued_whole_when_no_queue_server_answers(qmail_home):
    """A session with queue rights forks qmail-queue's code itself when qmail-qmqpd is not
    running: a message already spooled to a file (over 1 MiB) is replayed from it."""
    qmail_home.control("databytes", "0\n")
    with ListenerProcess(qmail_home) as listener:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT) as sock:
            replies = Replies(sock)
            replies.last(1)
            sock.sendall(b"HELO client\r\nMAIL FROM:<a@client.example>\r\nRCPT TO:<b@test.example>\r\nDATA\r\n")
            assert replies.last(4).startswith(b"354")
            sock.sendall(b"Subject: spooled\r\n\r\n" + BLOCK * 3 + b".\r\n")
            assert replies.last(1).startswith(b"250 ok ")
    [size] = queued_sizes(qmail_home)
    body = len(b"Subject: spooled\n\n") + 3 * len(BLOCK) * 75 // 76
    assert body < size < body + 1000        # plus the Received lines
