#!/usr/bin/env python3
"""Peak memory of one submission, by message size: qmail-smtpd's session worker, the
queue server's worker, and a local client handing a message to the queue socket.

    .venv/bin/python bench/session_memory.py [-s 10,200]      (sizes in MB)

For each size, on a throw-away home (qmailctl init, control/databytes 0 so that the
size is not refused) with qmail-qmqpd and qmail-smtpd-listen freshly started:
  smtp    one SMTP DATA of that size (generated while it is sent); the session
          worker's and the queueing worker's VmHWM (peak RSS, /proc/PID/status);
  local   the same size written by a client through qmailpy.queue.client's
          ServerSubmission (what sendmail and qmail-inject use without queue rights)
          to run/qmqp.sock; the client's and the queueing worker's peak RSS;
  sendmail  (as root only) the same size piped to sendmail run as uid 61040, which has
          no queue rights and so goes through the socket; its peak RSS.
Prints one line per size and path, with the seconds it took.
"""
import argparse
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil

BIN = os.path.dirname(os.path.abspath(sys.executable))
LINE = b"x" * 74 + b"\r\n"
BLOCK = LINE * (1048576 // len(LINE))


def make_home():
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(home, "control", "databytes"), "w") as f:
        f.write("0\n")
    return base, home


def start(argv, env, pattern):
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    line = proc.stderr.readline()
    found = re.search(pattern, line)
    if not found:
        proc.kill()
        raise SystemExit("%s did not start: %r" % (argv[0], line + proc.stderr.read()))
    return proc, found


def peak_of_children(pid):
    """The largest VmHWM (MB) of pid's children."""
    peak = 0
    for child in psutil.Process(pid).children():
        with open("/proc/%d/status" % child.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) // 1024)
    return peak


def replies(sock, buf, count):
    last = None
    while count:
        while b"\n" not in buf:
            data = sock.recv(65536)
            if not data:
                raise EOFError(buf)
            buf += data
        line, _, buf = buf.partition(b"\n")
        if line[3:4] == b" ":
            count -= 1
            last = line
    return last, buf


def smtp(port, megabytes):
    sock = socket.create_connection(("127.0.0.1", port))
    buf = b""
    _, buf = replies(sock, buf, 1)
    sock.sendall(b"HELO bench\r\nMAIL FROM:<a@bench.client>\r\nRCPT TO:<b@bench.example>\r\nDATA\r\n")
    last, buf = replies(sock, buf, 4)
    assert last.startswith(b"354"), last
    sock.sendall(b"Subject: large\r\n\r\n")
    for _ in range(megabytes):
        sock.sendall(BLOCK)
    sock.sendall(b".\r\n")
    last, buf = replies(sock, buf, 1)
    assert last.startswith(b"250 ok"), last
    sock.sendall(b"QUIT\r\n")
    sock.close()


LOCAL_CLIENT = r"""
import sys
from qmailpy.queue.client import ServerSubmission
block = b"x" * 75 + b"\n"
block = block * (1048576 // len(block))
s = ServerSubmission(sys.argv[1])
s.write(b"Subject: large\n\n")
for _ in range(int(sys.argv[2])):
    s.write(block)
r = s.finish(b"a@bench.example", [b"b@bench.example"])
assert r.ok, r
print([int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
"""


def run(megabytes, path):
    base, home = make_home()
    env = dict(os.environ, QMAILHOME=home)
    qmqpd, _ = start([os.path.join(BIN, "qmail-qmqpd")], env, rb"listening on")
    listener = None
    try:
        t0 = time.perf_counter()
        if path == "smtp":
            listener, found = start([os.path.join(BIN, "qmail-smtpd-listen"), "127.0.0.1:0"], env,
                                    rb"listening on 127\.0\.0\.1:(\d+)")
            smtp(int(found.group(1)), megabytes)
            client = peak_of_children(listener.pid)
            who = "session worker"
        elif path == "sendmail":
            message = os.path.join(base, "message")
            with open(message, "wb") as f:
                f.write(b"Subject: large\n\n")
                for _ in range(megabytes):
                    f.write(BLOCK.replace(b"\r\n", b"\n"))
            os.chmod(message, 0o644)
            with open(message, "rb") as f:
                t0 = time.perf_counter()
                done = subprocess.run(["setpriv", "--reuid=61040", "--regid=61040", "--clear-groups",
                                       "/usr/bin/time", "-f", "%M", os.path.join(BIN, "sendmail"),
                                       "-f", "a@bench.example", "b@bench.example"],
                                      env=env, stdin=f, stderr=subprocess.PIPE, check=True)
            client = int(done.stderr.split()[-1]) // 1024
            who = "sendmail"
        else:
            out = subprocess.run([sys.executable, "-c", LOCAL_CLIENT, home, str(megabytes)],
                                 env=env, check=True, stdout=subprocess.PIPE).stdout
            client = int(out)
            who = "local client"
        seconds = time.perf_counter() - t0
        server = peak_of_children(qmqpd.pid)
        print("%-8s %4d MB: %s peak RSS %4d MB, queue server worker %4d MB, %.1f s"
              % (path, megabytes, who, client, server, seconds))
    finally:
        for proc in (listener, qmqpd):
            if proc is not None:
                proc.terminate()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-s", default="10,200", help="message sizes in MB (default 10,200)")
    args = parser.parse_args()
    for megabytes in (int(s) for s in args.s.split(",")):
        for path in ("smtp", "local") + (("sendmail",) if os.geteuid() == 0 else ()):
            run(megabytes, path)


if __name__ == "__main__":
    main()
