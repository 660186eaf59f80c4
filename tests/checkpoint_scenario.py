"""A log-backend run whose checkpoints cross a segment holding a FINISH (issue 29).

Message M is in flight across a checkpoint (its delivery to slow@ waits on the fifo
GO), so that checkpoint lists it; M then finishes in the next segment, and a later
checkpoint deletes that segment (its records are all garbage) and M's body. Message K
(to later@, deferred, then held) keeps M's first segment from deletion, so the kept
checkpoint's snapshot of M stays readable. Run as a script (under strace by
tests/test_crash_states.py, directly by tests/test_logqueue_checkpoint_order.py):

    checkpoint_scenario.py HOME WORK

with the home's environment. It leaves in WORK: send.log (qmail-send's log),
old-checkpoint and old-counts (the files on disk while M was in flight) and
scenario.json: M's and K's numbers, the first segment, the one M finished in, and
{pid: tag} of each qmail-queue run that exited 0 (tags "m" and "f1", "f2" ...).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

from inotify_simple import INotify, flags

SLOW, LATER, FILLER = "slow@test.example", "later@test.example", "a@test.example"
SENDER = b"joe@test.example"
SEGMENT_LIMIT = 4096                     # control/logsegmentsize: setup() writes it
BIG_SENDER = b"j" * 980 + b"@test.example"    # near qmail-queue's address limit (1002)
BIG_ROOM = 1000                          # less than big's ENVELOPE, more than M's last records
MESSAGE = b"X-Crash-Id: %s\nSubject: crash\n\nmessage %s\n"


def setup(users, work):
    """The users: slow (waits for the fifo WORK/go, then its Maildir) and later (defers
    while WORK/go is a fifo, then its Maildir); a@ must exist already; a small segment
    size. The fifo's path."""
    users.qh.control("logsegmentsize", "%d\n" % SEGMENT_LIMIT)
    go = os.path.join(work, "go")
    os.mkfifo(go, 0o666)
    os.chmod(go, 0o666)
    slow = users.add("slow")
    users.dotqmail(slow, "", "|read x < %s\n./Maildir/\n" % go)
    users.dotqmail(users.add("later"), "", "|if test -p %s; then exit 111; fi\n./Maildir/\n" % go)
    return go


def release(go):
    """After the run: the fifo becomes a file, so deliveries to slow@ and later@ no
    longer wait or defer (a crash state's recovery delivers them)."""
    os.unlink(go)
    with open(go, "w") as f:
        f.write("go\n")
    os.chmod(go, 0o644)


def list_segments(logdir):
    return sorted(int(n[:-4]) for n in os.listdir(logdir) if n.endswith(".seg"))


class Run:
    def __init__(self, home, work):
        self.home, self.work = home, work
        self.logdir = os.path.join(home, "queue", "log")
        self.logpath = os.path.join(work, "send.log")
        self.ino = INotify()
        self.acked = {}
        self.ended = 0

    def lines(self):
        with open(self.logpath, "rb") as f:
            return f.read().decode("utf-8", "replace").split("\n")[:-1]

    def wait(self, predicate, what, timeout=60):
        """Wait (inotify on the log file and log/) until predicate() is true."""
        deadline = time.monotonic() + timeout
        while True:
            got = predicate()
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                sys.exit("timed out waiting for %s; log:\n%s" % (what, "\n".join(self.lines()[-30:])))
            self.ino.read(timeout=int(min(left, 1.0) * 1000))

    def line(self, pattern, count=1):
        regex = re.compile(pattern)
        return self.wait(lambda: [m for m in map(regex.search, self.lines()) if m][count - 1:] or None,
                         pattern)[-1]

    def start_queue(self, tag):
        """qmail-queue with the message written; finish_queue() hands it the envelope."""
        r, w = os.pipe()
        p = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=r)
        os.close(r)
        p.stdin.write(MESSAGE % (tag.encode(), tag.encode()))
        p.stdin.close()
        return p, w, tag

    def finish_queue(self, started, rcpt, sender=SENDER):
        p, w, tag = started
        os.write(w, b"F" + sender + b"\0T" + rcpt.encode() + b"\0\0")
        os.close(w)
        assert p.wait() == 0, tag
        self.acked[p.pid] = tag

    def queue(self, tag, rcpt):
        self.finish_queue(self.start_queue(tag), rcpt)

    def head_size(self):
        segs = list_segments(self.logdir)
        return os.path.getsize(os.path.join(self.logdir, "%010d.seg" % segs[-1]))

    def fill_until(self, segments):
        while len(list_segments(self.logdir)) < segments:
            self.ended += 1
            self.queue("f%d" % self.ended, FILLER)
            self.line(r"^end msg ", self.ended)

    def checkpoint_listing(self, n):
        def listed():
            try:
                with open(os.path.join(self.logdir, "checkpoint"), "rb") as f:
                    data = f.read()
                with open(os.path.join(self.logdir, "counts"), "rb") as f:
                    counts = f.read()
            except FileNotFoundError:
                return None
            return (data, counts) if str(n) in json.loads(data.rsplit(b" ", 1)[0])["active"] else None
        return self.wait(listed, "a checkpoint listing msg %d in flight" % n)

    def main(self, go):
        self.ino.add_watch(self.work, flags.MODIFY)
        self.ino.add_watch(self.logdir, flags.MOVED_TO | flags.DELETE | flags.CREATE)
        with open(self.logpath, "wb") as log:
            send = subprocess.Popen(["qmail-start", "./Maildir/"], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, cwd="/", start_new_session=True)
        try:
            self.line(r"^status: local")
            self.queue("k", LATER)
            self.line(r"^delivery \d+: deferral: ")
            k = int(self.line(r"starting delivery \d+: msg (\d+) to local " + re.escape(LATER)).group(1))
            hold = subprocess.run(["qmailctl", "queue", "hold", "--home", self.home, "--timeout", "30", str(k)],
                                  capture_output=True)
            assert hold.returncode == 0, hold.stderr
            self.queue("m", SLOW)
            m = int(self.line(r"starting delivery \d+: msg (\d+) to local " + re.escape(SLOW)).group(1))
            old = self.checkpoint_listing(m)
            first = list_segments(self.logdir)[0]
            self.fill_until(2)                  # M's DELIVERY and FINISH go to the second segment
            # Room left there for M's last records (a few hundred bytes) but not for the
            # ENVELOPE of `big` (its long sender): that one rotates to a third segment
            # at once after M's FINISH, so the next checkpoint, the first since M was in
            # flight, deletes the second.
            while self.head_size() < SEGMENT_LIMIT - BIG_ROOM:
                assert len(list_segments(self.logdir)) == 2, "rotated while filling: BIG_ROOM too small"
                self.ended += 1
                self.queue("f%d" % self.ended, FILLER)
                self.line(r"^end msg ", self.ended)
            big = self.start_queue("big")
            with open(go, "w") as f:
                f.write("go\n")
            self.ended += 1
            self.line(r"^end msg %d$" % m)
            finished_in = list_segments(self.logdir)[-1]
            assert finished_in != first
            self.finish_queue(big, FILLER, BIG_SENDER)
            assert list_segments(self.logdir)[-1] > finished_in
            self.wait(lambda: finished_in not in list_segments(self.logdir),
                      "segment %d deleted" % finished_in)
        finally:
            send.send_signal(signal.SIGTERM)
            assert send.wait(timeout=60) == 0
        for name, data in zip(("old-checkpoint", "old-counts"), old):
            with open(os.path.join(self.work, name), "wb") as f:
                f.write(data)
        with open(os.path.join(self.work, "scenario.json"), "w") as f:
            json.dump({"m": m, "k": k, "first": first, "finished_in": finished_in,
                       "acked": self.acked}, f)


if __name__ == "__main__":
    home, work = sys.argv[1], sys.argv[2]
    Run(home, work).main(os.path.join(work, "go"))
