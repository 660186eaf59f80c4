"""qmail-rspawn driven over its two pipes, as qmail-send drives it (Rspawn), and a message
file put straight into the queue's mess/ for it to send (put_message).
"""
import os
import select
import subprocess
import sys
import time

from qmailpy import spawn


class Rspawn:
    """A running qmail-rspawn for a home, driven over its two pipes."""

    def __init__(self, home, env=None):
        program = os.path.join(os.path.dirname(sys.executable), "qmail-rspawn")
        self.proc = subprocess.Popen([program], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env or home.env)
        self.reader = spawn.ReplyReader()
        self.greeting = self._read(1, 30)

    def _read(self, n, timeout):
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, "qmail-rspawn did not answer in time"
        return os.read(fd, n)

    def command(self, slot, messid, sender, recipient):
        self.commands([(slot, messid, sender, recipient)])

    def commands(self, commands):
        """Several commands in one write, as qmail-send sends a message's recipients."""
        self.proc.stdin.write(b"".join(spawn.encode_command(*c) for c in commands))
        self.proc.stdin.flush()

    def replies(self, count, timeout=60):
        got = {}
        deadline = time.monotonic() + timeout
        while len(got) < count:
            data = self._read(65536, max(0.1, deadline - time.monotonic()))
            assert data, "qmail-rspawn closed its output early"
            for slot, letter, text in self.reader.feed(data):
                got[slot] = letter + text
        return got

    def finish(self):
        self.proc.stdin.close()
        rest = self.proc.stdout.read()
        code = self.proc.wait(30)
        assert rest == b"" and code == 0, (rest, code, self.proc.stderr.read())


def put_message(home, n, data):
    path = os.path.join(home.queue, "mess", str(n % 23), str(n))
    with open(path, "wb") as f:
        f.write(data)
    if os.geteuid() == 0:
        os.chown(path, home.uid, home.gid)
    return b"%d/%d" % (n % 23, n)
