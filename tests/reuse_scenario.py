"""A qmail-send run in which a new message is queued once an ended message's body is gone,
for the crash-state explorer to give it the ended message's number (qmail names messages
by their mess/ inode; crashstates.renumber). Run as a script (under strace by
tests/test_crash_states.py):

    reuse_scenario.py HOME WORK A

with the home's environment, A the number of a message queued to a@ before the run. It
starts qmail-start, waits until A has ended and qmail-clean has unlinked its body, then
queues message b to b@ and lets it end. It leaves in WORK: send.log (qmail-send's log)
and scenario.json: {"acked": {pid: tag} of the qmail-queue run that exited 0}.

The file system may give b A's inode itself (ext4 gives a new file the lowest free
inode of its block group: on a busy disk seldom the one just freed, 0 of 10 tries in
one run here); renumber() makes the recording as if it had.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

from inotify_simple import INotify, flags

from qmailpy.layout import SPLIT

RCPT, SENDER = b"b@test.example", b"joe@test.example"
MESSAGE = b"X-Crash-Id: %s\nSubject: crash\n\nmessage %s\n"


class Run:
    def __init__(self, home, work, a):
        self.home, self.work, self.a = home, work, a
        self.body = os.path.join(home, "queue", "mess", str(a % SPLIT), str(a))
        self.logpath = os.path.join(work, "send.log")
        self.ino = INotify()
        self.acked = {}

    def lines(self):
        with open(self.logpath, "rb") as f:
            return f.read().decode("utf-8", "replace").split("\n")[:-1]

    def wait(self, predicate, what, timeout=60):
        """Wait (inotify on the log file and A's mess/S/) until predicate() is true."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                sys.exit("timed out waiting for %s; log:\n%s" % (what, "\n".join(self.lines()[-30:])))
            self.ino.read(timeout=int(min(left, 1.0) * 1000))

    def ended(self):
        return [l for l in self.lines() if re.match(r"^end msg \d+$", l)]

    def queue(self, tag):
        r, w = os.pipe()
        p = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=r)
        os.close(r)
        p.stdin.write(MESSAGE % (tag.encode(), tag.encode()))
        p.stdin.close()
        os.write(w, b"F" + SENDER + b"\0T" + RCPT + b"\0\0")
        os.close(w)
        assert p.wait() == 0, tag
        self.acked[p.pid] = tag

    def main(self):
        self.ino.add_watch(self.work, flags.MODIFY)
        self.ino.add_watch(os.path.dirname(self.body), flags.DELETE | flags.CREATE)
        with open(self.logpath, "wb") as log:
            send = subprocess.Popen(["qmail-start", "./Maildir/"], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, cwd="/", start_new_session=True)
        try:
            self.wait(lambda: "end msg %d" % self.a in self.ended() and not os.path.exists(self.body),
                      "msg %d ended and its body removed" % self.a)
            self.queue("b")
            self.wait(lambda: len(self.ended()) >= 1 + len(self.acked), "every message ended")
        finally:
            send.send_signal(signal.SIGTERM)
            assert send.wait(timeout=60) == 0
        with open(os.path.join(self.work, "scenario.json"), "w") as f:
            json.dump({"acked": self.acked}, f)


if __name__ == "__main__":
    Run(sys.argv[1], sys.argv[2], int(sys.argv[3])).main()
