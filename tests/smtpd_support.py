"""Helpers for the qmail-smtpd, listener, sendmail and qmail-inject tests.

SmtpdProcess runs the real qmail-smtpd program with a connected socket on its fds 0/1, as
tcpserver does; the test holds the other end. session() and start() open one and read its
greeting, open_data() takes it to DATA. ListenerProcess runs qmail-smtpd-listen; relay()
sends through it to a domain outside rcpthosts, write_rules() replaces control/smtpclients,
no_relay_env() drops RELAYCLIENT. env() is qmail-inject's environment with none of the
caller's own names. queue_view.queued() and mess_count() read what reached the queue."""
import os
import re
import signal
import smtplib
import socket
import subprocess
import threading

from queue_view import queued

TIMEOUT = 30
REPLY_LINE = re.compile(rb"\A[2-5][0-9][0-9][ -][^\r\n]*\r\n\Z")


def tcp_env(home, **extra):
    env = dict(home.env)
    for name in ("RELAYCLIENT", "DATABYTES", "TCPREMOTEHOST", "TCPREMOTEINFO", "TCPLOCALHOST"):
        env.pop(name, None)
    env.update(PROTO="TCP", TCPREMOTEIP="192.0.2.7", TCPREMOTEPORT="4000",
               TCPLOCALIP="127.0.0.1", TCPLOCALPORT="25")
    env.update(extra)
    return env


class SmtpdProcess:
    def __init__(self, home, argv=("qmail-smtpd",), **env):
        self.client, server = socket.socketpair()
        self.client.settimeout(TIMEOUT)
        try:
            self.proc = subprocess.Popen(list(argv), stdin=server, stdout=server,
                                         stderr=subprocess.PIPE, env=tcp_env(home, **env))
        finally:
            server.close()
        self.pending = b""

    def send(self, data):
        self.client.sendall(data)

    def send_while_reading(self, data):
        """Sends data from another thread, so that the caller can read the replies meanwhile:
        a pipelining client must (RFC 2920), or once the replies fill the socket's buffers the
        server stops reading and both ends wait on each other. Returns finish(), which waits
        for the last byte to be sent and raises what sending raised."""
        failed = []

        def send():
            try:
                self.client.sendall(data)
            except OSError as e:
                failed.append(e)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()

        def finish():
            sender.join(TIMEOUT)
            assert not sender.is_alive(), "still sending after %d s" % TIMEOUT
            if failed:
                raise failed[0]
        return finish

    def _line(self):
        while b"\n" not in self.pending:
            data = self.client.recv(65536)
            if not data:
                raise EOFError("connection closed; unread: %r" % self.pending)
            self.pending += data
        line, _, self.pending = self.pending.partition(b"\n")
        return line + b"\n"

    def reply(self):
        """One complete (possibly multi-line) reply as bytes, each line checked for form."""
        lines = []
        while True:
            line = self._line()
            assert REPLY_LINE.match(line), line
            lines.append(line)
            if line[3:4] == b" ":
                return b"".join(lines)

    def command(self, data):
        self.send(data)
        return self.reply()

    def rest(self):
        """Everything until the server closes the connection."""
        data = self.pending
        self.pending = b""
        while True:
            chunk = self.client.recv(65536)
            if not chunk:
                return data
            data += chunk

    def close(self):
        """Close our end; the exit status. What the server wrote to fd 2 is kept in .stderr."""
        self.client.close()
        self.stderr = self.proc.stderr.read()
        return self.proc.wait(timeout=TIMEOUT)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.client.close()
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()
        self.client.close()


def reporting_queue(home, *words):
    """home's environment with $QMAILQUEUE set to a stand-in that reports the session's
    environment through fd 6, qmail's way (exit 82 with "D" and a text: qmail-smtpd answers
    554 and the text): the shell words (like "$PROTO"), joined with |."""
    script = os.path.join(home.path, "envqueue")
    with open(script, "w") as f:
        f.write('#!/bin/sh\ncat >/dev/null\nprintf "D%s" %s >&6\nexit 82\n'
                % ("|".join(["%s"] * len(words)), " ".join('"%s"' % w for w in words)))
    os.chmod(script, 0o755)
    return dict(home.env, QMAILQUEUE=script)


def mess_count(home):
    return sum(len(os.listdir(os.path.join(home.queue, "mess", str(i)))) for i in range(23))


class ListenerProcess:
    """qmail-smtpd-listen on `address` (127.0.0.1), port chosen by the kernel; .port once it listens."""

    def __init__(self, home, *options, env=None, address="127.0.0.1", blocked=()):
        """blocked: signals the listener starts with blocked (a mask inherited from its parent)."""
        def block():
            signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        self.proc = subprocess.Popen(["qmail-smtpd-listen", *options, "%s:0" % address],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env or home.env,
                                     preexec_fn=block if blocked else None)
        line = self.proc.stderr.readline()
        m = re.match(rb"qmail-smtpd-listen: listening on %s:(\d+)\n" % re.escape(address.encode()), line)
        assert m, line + self.proc.stderr.read()
        self.port = int(m.group(1))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(timeout=TIMEOUT)
        self.proc.stderr.close()
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.proc.stderr.closed:
            self.proc.stderr.close()


GREETING = b"220 test.example ESMTP\r\n"


def session(home, **env):
    s = SmtpdProcess(home, **env)
    assert s.reply() == GREETING
    return s


def start(home, **env):
    s = SmtpdProcess(home, **env)
    assert s.reply() == b"220 test.example ESMTP\r\n"
    return s


def open_data(s, rcpts=(b"x@test.example",)):
    assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"250 ok\r\n"
    for r in rcpts:
        assert s.command(b"RCPT TO:<" + r + b">\r\n") == b"250 ok\r\n"
    assert s.command(b"DATA\r\n") == b"354 go ahead\r\n"


def assert_nothing_queued(home):
    assert queued(home) == []
    assert mess_count(home) == 0


def env(home, **extra):
    e = dict(home.env)
    for name in ("QMAILUSER", "MAILUSER", "USER", "LOGNAME", "QMAILHOST", "MAILHOST", "QMAILNAME",
                 "MAILNAME", "NAME", "QMAILSUSER", "QMAILSHOST", "QMAILINJECT", "QMAILMFTFILE",
                 "QMAILDEFAULTDOMAIN", "QMAILDEFAULTHOST", "QMAILPLUSDOMAIN", "QMAILIDHOST",
                 "QMAILQUEUE"):
        e.pop(name, None)
    e.update(USER="joe")
    e.update(extra)
    return e


MESSAGE = b"Subject: relay\r\n\r\nhi\r\n"


def no_relay_env(home):
    env = dict(home.env)
    env.pop("RELAYCLIENT", None)
    return env


def write_rules(home, text):
    """Replace control/smtpclients whole (new inode), as an admin's editor or install would."""
    final = home.control("smtpclients.new", text)
    os.rename(final, os.path.join(home.path, "control", "smtpclients"))


def relay(port, source="127.0.0.1"):
    """Send one message to a domain outside rcpthosts from source; smtplib's refusals."""
    with smtplib.SMTP("127.0.0.1", port, timeout=TIMEOUT, source_address=(source, 0)) as c:
        return c.sendmail("me@test.example", ["far@elsewhere.example"], MESSAGE)
