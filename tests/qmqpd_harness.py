"""Running qmail-qmqpd on a test home and talking QMQP to it.

    with QmqpServer(home, "-t", "5") as server:
        server.socket                       # the local socket's path
        server.tcp                          # (host, port) when started with --tcp
        ask(server.socket, request(...))    # the K/Z/D answer

The server is started with the home's environment; start() returns once it has
written its "listening on" line.
"""
import os
import re
import signal
import socket
import subprocess

from qmailpy.queue.qmqp import netstring, parse_answer, request   # noqa: F401 (for tests)


class QmqpServer:
    def __init__(self, home, *args, env=None, **popen):
        self.home = home
        self.args = list(args)
        self.env = env or home.env
        self.popen = popen
        self.socket = os.path.join(home.path, "run", "qmqp.sock")
        self.tcp = None
        self.proc = None
        self.stderr = b""

    def start(self):
        self.proc = subprocess.Popen(["qmail-qmqpd"] + self.args, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, **self.popen)
        line = self.proc.stderr.readline()
        self.stderr += line
        assert b"listening on" in line, line + self.proc.stderr.read()
        found = re.search(rb" and (\S+):(\d+)$", line.strip())
        if found:
            self.tcp = (found.group(1).decode(), int(found.group(2)))
        return self

    def stop(self, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc and self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self.stderr += self.proc.stderr.read()
        self.proc.stderr.close()
        return code

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc.stderr.close()


def connect(path_or_address, timeout=60):
    family = socket.AF_UNIX if isinstance(path_or_address, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path_or_address)
    return sock


def read_answer(sock):
    """The server's K/Z/D text, or b"" when it closed the connection without one."""
    got = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        got += chunk
        if parse_answer(got) is not None:
            break
    return parse_answer(got) if got else b""


def ask(path_or_address, data, shut=False):
    """Send data, optionally close our side, and return the answer (b"" if none)."""
    with connect(path_or_address) as sock:
        try:
            sock.sendall(data)
            if shut:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_answer(sock)
