"""How many messages the log backend holds in each state, without reading the queue
(`qmailctl queue size`, qmail-qstat; docs/log-queue.md "Counting the queue").

A message's state is that of its newest ENVELOPE, snapshot or FINISH record
(state_of). Each such record names the one it supersedes (`prev`; an ENVELOPE
none), so its effect on the counts is its state minus that of the record at prev
(delta): the sum over a message's records telescopes to the state of its newest.
A prev that cannot be read (its segment deleted, all garbage) counts as nothing:
the first record still in the log then stands for the message alone.

qmail-send applies delta() to every record its new-work cursor passes (it passes
all of them, its own appends included) and, at each checkpoint, writes the counts
with the position they cover to queue/log/counts (atomically, before the checkpoint
itself). A reader adds the deltas of the records after that position: the work of
the last few seconds while qmail-send runs. Recovery applies the records it
replays from that position; without a usable file it counts the whole log once.
After damage (a record destroyed, then restored by qmail-send) the counts may be
off until `qmailctl queue size --exact` or a recount.
"""
import json
import os

from qmailpy.backends.log import records as R
from qmailpy.backends.base import QueueError
from qmailpy.fileio import create_fresh

FIELDS = ("new", "preprocessed", "local", "remote", "held")
COUNTS = "counts"
_NOTHING = (0, 0, 0, 0, 0)


def state_of(rec):
    """(new, preprocessed, local, remote, held) of a message whose newest record is rec."""
    if rec.type == R.ENVELOPE:
        return (1, 0, 0, 0, 0)
    if rec.type in R.SNAPSHOTS:
        return (0, 1, int("local" in rec.channels), int("remote" in rec.channels),
                int(bool(rec.fields.get("held"))))
    return _NOTHING


def counted(type):
    """True for the record types that change a message's state."""
    return type == R.ENVELOPE or type == R.FINISH or type in R.SNAPSHOTS


class Counts:
    """Messages per state, covering the records before `pos`."""

    def __init__(self, values=_NOTHING, pos=None):
        self.values = list(values)
        self.pos = pos

    def delta(self, rec, read_at):
        """Apply one record; read_at(pos) reads the record it supersedes."""
        now = state_of(rec)
        before = _NOTHING
        prev = rec.fields.get("prev")
        if prev is not None and tuple(prev) != R.NOWHERE:
            try:
                before = state_of(read_at(tuple(prev)))
            except (QueueError, OSError, ValueError):
                pass
        for i in range(len(FIELDS)):
            self.values[i] += now[i] - before[i]

    def as_dict(self):
        d = dict(zip(FIELDS, self.values))
        d["total"] = d["new"] + d["preprocessed"]
        return d

    def write(self, logdir):
        body = json.dumps({"pos": list(self.pos), **dict(zip(FIELDS, self.values))},
                          separators=(",", ":")).encode()
        tmp = os.path.join(logdir, COUNTS + ".tmp")
        fd = create_fresh(tmp, 0o660)
        try:
            os.write(fd, body + b" %d\n" % R.crc32c(body))
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(logdir, COUNTS))


def count_from(cur, counts, read_at, tail=None):
    """Add to counts every record from the cursor's position to tail (None: the log's
    end), reading in full only the records that count; the cursor ends past them."""
    while tail is None or cur.pos < tail:
        head = cur.peek_schedule()
        if head is None:
            break
        if counted(head[0]):
            rec = cur.decode_here()
            if rec is not None:
                counts.delta(rec, read_at)
        cur.skip(head[5])
    return counts


def read(logdir):
    """The Counts qmail-send last wrote, or None (no file, or a damaged one)."""
    try:
        with open(os.path.join(logdir, COUNTS), "rb") as f:
            data = f.read()
        body, crc = data.rstrip(b"\n").rsplit(b" ", 1)
        if int(crc) != R.crc32c(body):
            return None
        d = json.loads(body)
        return Counts([int(d[k]) for k in FIELDS], tuple(d["pos"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
