"""A POP3 server as tcpserver would run it (qmail-popup ... qmail-pop3d Maildir on an
accepted 127.0.0.1 connection) and a test checkpassword, for tests/test_pop3.py."""
import os
import socket
import subprocess
import sys

AS_ROOT = os.geteuid() == 0

# The checkpassword interface: name\0password\0timestamp\0 on fd 3; a right password
# makes it the mailbox's owner (when it is root, as a real checkpassword is) in that
# home and runs its arguments; a wrong one exits 1.
CHECKPASSWORD = """#!%s
import os, sys
data = b""
while True:
    chunk = os.read(3, 512)
    if not chunk:
        break
    data += chunk
user, password = data.split(b"\\0")[:2]
if (user, password) != (b"alice", b"s3cret"):
    sys.exit(1)
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(int(os.environ["MAILBOX_GID"]))
    os.setuid(int(os.environ["MAILBOX_UID"]))
os.chdir(os.environ["MAILBOX_HOME"])
os.environ["HOME"] = os.environ["MAILBOX_HOME"]
os.environ["USER"] = "alice"
os.execvp(sys.argv[1], sys.argv[1:])
""" % sys.executable


class Mailbox:
    """alice's home with a Maildir, owned like the qmail home (nobody as root)."""

    def __init__(self, home):
        self.home = home
        self.path = os.path.join(home.path, "alice")
        self.maildir = os.path.join(self.path, "Maildir")
        for sub in ("", "/tmp", "/new", "/cur"):
            os.makedirs(self.maildir + sub, 0o700, exist_ok=True)
        self.checkpw = os.path.join(home.path, "checkpw")
        with open(self.checkpw, "w") as f:
            f.write(CHECKPASSWORD)
        os.chmod(self.checkpw, 0o755)
        self.chown(self.path)
        self.chown(self.maildir)
        for sub in ("tmp", "new", "cur"):
            self.chown(os.path.join(self.maildir, sub))

    def chown(self, path):
        if AS_ROOT:
            os.chown(path, self.home.uid, self.home.gid)

    def deliver(self, name, data, mtime):
        path = os.path.join(self.maildir, "new", name)
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, (mtime, mtime))
        self.chown(path)
        return path

    def names(self, sub):
        return sorted(os.listdir(os.path.join(self.maildir, sub)))

    def env(self, **extra):
        env = dict(self.home.env)
        env.update(PROTO="TCP", TCPREMOTEIP="127.0.0.1", TCPLOCALIP="127.0.0.1",
                   MAILBOX_HOME=self.path, MAILBOX_UID=str(self.home.uid),
                   MAILBOX_GID=str(self.home.gid))
        env.update(extra)
        return env


class Session:
    """A client connected to a fresh qmail-popup over TCP on 127.0.0.1."""

    def __init__(self, mailbox, hostname="test.example", argv=None, **env):
        server = socket.create_server(("127.0.0.1", 0))
        self.sock = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        server.close()
        argv = argv or ["qmail-popup", hostname, mailbox.checkpw, "qmail-pop3d", "Maildir"]
        self.proc = subprocess.Popen(argv, stdin=conn, stdout=conn, stderr=subprocess.DEVNULL,
                                     env=mailbox.env(**env))
        conn.close()
        self.sock.settimeout(60)
        self.file = self.sock.makefile("rb")

    def line(self):
        return self.file.readline()

    def send(self, data):
        self.sock.sendall(data)

    def cmd(self, text):
        self.send(text.encode() + b"\r\n")
        return self.line()

    def multiline(self):
        lines = []
        while True:
            line = self.line()
            assert line, "connection closed inside a multi-line reply"
            lines.append(line)
            if line == b".\r\n":
                return b"".join(lines)

    def login(self):
        greeting = self.line()
        assert greeting.startswith(b"+OK <")
        assert self.cmd("USER alice") == b"+OK \r\n"
        assert self.cmd("PASS s3cret") == b"+OK \r\n"

    def close(self):
        self.file.close()
        self.sock.close()
        return self.proc.wait(60)
