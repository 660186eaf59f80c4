"""A backend-neutral look at a test home's queue, for tests that run on both backends.

queued(home): the messages queued but not yet preprocessed (S4), oldest number
first, each with its envelope (sender, recipients, uid) and its mess/ bytes; on the
directory backend from todo/, on the log backend from the live ENVELOPE records
that `open_backend(home)` reads.

leftovers(home): what says "this queue still holds something": on the directory
backend every file outside lock/ and pid/; on the log backend every file outside
lock/, pid/ and log/, plus any segment with a live record and any segment but
the newest (an empty queue keeps log/'s bookkeeping files and at most one head
segment with nothing live in it). [] means the queue is empty.
"""
import os

from qmailpy.envelope import parse_todo

SPLIT = 23


class Queued:
    def __init__(self, n, sender, recipients, uid, mess):
        self.n, self.sender, self.recipients, self.uid, self.mess = n, sender, recipients, uid, mess

    def body_after_received(self, count=2):
        """mess bytes without the first `count` Received lines (qmail-queue's, qmail-smtpd's)."""
        data = self.mess
        for _ in range(count):
            assert data.startswith(b"Received: "), data[:80]
            end = data.index(b"\n")
            while data[end + 1:end + 2] in (b" ", b"\t"):
                end = data.index(b"\n", end + 1)
            data = data[end + 1:]
        return data


def _mess(home, n):
    with open(os.path.join(home.queue, "mess", str(n % SPLIT), str(n)), "rb") as f:
        return f.read()


def _backend(home):
    from qmailpy.backends import open_backend
    return open_backend(home.path)


def queued(home):
    """Every message queued but not yet preprocessed, oldest inode first."""
    backend = _backend(home)
    if backend.name == "log":
        from qmailpy import states
        try:
            envelopes = {n: m["rec"] for n, m in backend.latest_states().items()
                         if m["state"] == states.S4}
        finally:
            backend.close()
        return [Queued(n, rec.sender, list(rec.recipients), rec.uid, _mess(home, n))
                for n, rec in sorted(envelopes.items())]
    todo_dir = os.path.join(home.queue, "todo")
    out = []
    for name in sorted(os.listdir(todo_dir), key=int):
        with open(os.path.join(todo_dir, name), "rb") as f:
            todo = parse_todo(f.read())
        n = int(name)
        out.append(Queued(n, todo.sender, todo.recipients, todo.uid, _mess(home, n)))
    return out


def _files(home, skip):
    return sorted(os.path.relpath(os.path.join(root, f), home.queue)
                  for root, _, files in os.walk(home.queue) for f in files
                  if os.path.relpath(root, home.queue).split("/")[0] not in skip)


def leftovers(home):
    """What the queue still holds ([] = empty; see the module docstring)."""
    backend = _backend(home)
    if backend.name != "log":
        return _files(home, ("lock", "pid"))
    from qmailpy.backends.log.commit import list_segments, segment_name
    try:
        live = {}
        for rec in backend.scan(report=False):
            if not rec.garbage:
                live.setdefault(rec.pos[0], []).append(rec)
        latest = backend.latest_states()
    finally:
        backend.close()
    out = _files(home, ("lock", "pid", "log"))
    segments = list_segments(backend.logdir)
    for seg in segments:
        # A live record can be a superseded one whose flag the next checkpoint writes:
        # what counts is whether any message in the segment is still in the queue.
        if seg != segments[-1] or any(rec.n in latest for rec in live.get(seg, ())):
            out.append(os.path.join("log", segment_name(seg)))
    out.extend("message %d in the log" % n for n in sorted(latest))
    return out


def schedule(home, n):
    """(birth, {channel: next attempt}) of preprocessed message n, or None if it is not there.

    Directory backend: info/'s mtime and each channel file's mtime (qmail keeps the
    next retry time there); log backend: the live snapshot record's fields."""
    backend = _backend(home)
    if backend.name == "log":
        from qmailpy import states
        try:
            m = backend.latest_states().get(n)
        finally:
            backend.close()
        if m is None or m["state"] != states.S5:
            return None
        rec = m["rec"]
        return int(rec.birth), {c: int(due) for c, (due, _) in rec.channels.items()}
    s = str(n % SPLIT)
    try:
        birth = int(os.stat(os.path.join(home.queue, "info", s, str(n))).st_mtime)
    except FileNotFoundError:
        return None
    dues = {}
    for channel in ("local", "remote"):
        try:
            dues[channel] = int(os.stat(os.path.join(home.queue, channel, s, str(n))).st_mtime)
        except FileNotFoundError:
            pass
    return birth, dues


def mtime_of(home, msg):
    """The mtime of message msg's mess/ file, in whole seconds."""
    return int(os.stat(os.path.join(home.queue, "mess", str(msg.n % SPLIT), str(msg.n))).st_mtime)
