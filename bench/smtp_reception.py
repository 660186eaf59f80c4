#!/usr/bin/env python3
"""SMTP reception: C concurrent clients send N messages to qmail-smtpd-listen.

Every message is accepted by qmail-smtpd and queued by qmail-queue's code in a
forked child (fsync'd, linked into todo/) before its "250 ok"; no qmail-send
runs, so the messages stay in todo/ and are counted there at the end.

Prints: messages/s until all are queued; the per-connection cost of starting a
qmail-smtpd session (connect -> 220 greeting -> QUIT -> 221) through the
listener (a fork), and, for comparison, of starting the qmail-smtpd program as
a new process per connection (what tcpserver or systemd Accept=yes do).

Usage: .venv/bin/python bench/smtp_reception.py [-c CLIENTS] [-n MESSAGES]
                                               [-m MESSAGES_PER_CONNECTION] [-s BODY_BYTES]
"""
import argparse
import multiprocessing
import os
import pwd
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.dirname(os.path.abspath(sys.executable))


def make_home():
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    return base, home


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def replies(self, count):
        """Read `count` final reply lines; return the last one."""
        last = None
        while count:
            while b"\n" not in self.buf:
                data = self.sock.recv(65536)
                if not data:
                    raise EOFError(self.buf)
                self.buf += data
            line, _, self.buf = self.buf.partition(b"\n")
            if line[3:4] == b" ":
                count -= 1
                last = line
        return last


def client(port, count, per_conn, body, results):
    sent = 0
    failures = 0
    while sent < count:
        c = Conn(port)
        c.replies(1)
        c.sock.sendall(b"HELO bench.client\r\n")
        c.replies(1)
        for _ in range(min(per_conn, count - sent)):
            c.sock.sendall(b"MAIL FROM:<sender@bench.client>\r\nRCPT TO:<rcpt@bench.example>\r\n"
                           b"DATA\r\n")
            if c.replies(3) != b"354 go ahead\r":
                failures += 1
                break
            c.sock.sendall(body)
            if not c.replies(1).startswith(b"250 ok "):
                failures += 1
            sent += 1
        c.sock.sendall(b"QUIT\r\n")
        c.replies(1)
        c.sock.close()
    results.put((sent, failures))


def startup_cost(port, rounds):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        c = Conn(port)
        c.replies(1)
        t1 = time.perf_counter()
        c.sock.sendall(b"QUIT\r\n")
        c.replies(1)
        c.sock.close()
        times.append(t1 - t0)
    return statistics.median(times)


def exec_startup_cost(home, rounds):
    env = dict(os.environ, QMAILHOME=home, PROTO="TCP", TCPREMOTEIP="127.0.0.1",
               TCPLOCALIP="127.0.0.1")
    times = []
    for _ in range(rounds):
        a, b = socket.socketpair()
        t0 = time.perf_counter()
        proc = subprocess.Popen([os.path.join(BIN, "qmail-smtpd")], stdin=b, stdout=b, env=env)
        b.close()
        greeting = a.recv(1000)
        t1 = time.perf_counter()
        assert greeting.startswith(b"220 "), greeting
        a.sendall(b"QUIT\r\n")
        a.recv(1000)
        a.close()
        proc.wait()
        times.append(t1 - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-c", "--clients", type=int, default=4)
    ap.add_argument("-n", "--messages", type=int, default=2000)
    ap.add_argument("-m", "--per-connection", type=int, default=1)
    ap.add_argument("-s", "--size", type=int, default=2000, help="body bytes per message")
    args = ap.parse_args()
    base, home = make_home()
    body = (b"From: sender@bench.client\r\nTo: rcpt@bench.example\r\nSubject: bench\r\n\r\n"
            + (b"x" * 78 + b"\r\n") * max(1, args.size // 80) + b".\r\n")
    listener = subprocess.Popen([os.path.join(BIN, "qmail-smtpd-listen"), "-c", "100", "-s", "100",
                                 "127.0.0.1:0"], stderr=subprocess.PIPE,
                                env=dict(os.environ, QMAILHOME=home))
    try:
        line = listener.stderr.readline()
        port = int(re.search(rb":(\d+)\n", line).group(1))
        share = [args.messages // args.clients + (i < args.messages % args.clients)
                 for i in range(args.clients)]
        results = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=client, args=(port, k, args.per_connection, body,
                                                              results)) for k in share]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        totals = [results.get() for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - t0
        sent = sum(t[0] for t in totals)
        failures = sum(t[1] for t in totals)
        queued = len(os.listdir(os.path.join(home, "queue", "todo")))
        fork_cost = startup_cost(port, 200)
        exec_cost = exec_startup_cost(home, 20)
    finally:
        listener.terminate()
        listener.wait()
        listener.stderr.close()
        shutil.rmtree(base, ignore_errors=True)
    print("smtp reception: %d clients, %d messages (%d per connection), %d body bytes"
          % (args.clients, args.messages, args.per_connection, len(body)))
    print("  queued %d (in todo/), failures %d, %.2f s" % (queued, failures, elapsed))
    print("  %.0f messages/s" % (sent / elapsed))
    print("  session start via listener fork: %.2f ms median (connect -> 220)" % (fork_cost * 1000))
    print("  session start via exec of qmail-smtpd: %.2f ms median (for comparison)"
          % (exec_cost * 1000))
    return 0 if failures == 0 and queued == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
