"""New work on the log backend: the ENVELOPEs qmail-queue appended, and their
preprocessing into a PREPROCESSED snapshot (S4 -> S5; the record: preprocess.py).

Interface: NewWork(state, segments, garbage) with a LogState (state.py), Segments
(segments.py) and Garbage (garbage.py). scan() reads the log from state.new_cursor
(which recovery sets up first) to its end, adding unpreprocessed ENVELOPEs to
state.pending_new, applying each counted record to state.state_counts and dropping
reused numbers from state.replayed_clean. preprocess() reads the ENVELOPE and mess/S/n's
size and mode, appends the PREPROCESSED record, supersedes the ENVELOPE and puts the
message in flight (state.active), or records it in state.set_aside. Owns nothing.
"""
import os

from qmailpy import logline
from qmailpy.backends.base import Preprocessed, QueueError, SetAside
from qmailpy.backends.log import counts as logcounts, records as R
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.preprocess import preprocessed
from qmailpy.backends.log.state import now as _now
from qmailpy.layout import CHANNELS, relpath
from qmailpy.mess import hold_asked


class NewWork:
    def __init__(self, state, segments, garbage):
        self.state = state
        self.segments = segments
        self.garbage = garbage

    def scan(self):
        """Read what others appended since last time; remember unpreprocessed ENVELOPEs."""
        state = self.state
        cur = state.new_cursor
        while True:
            head = cur.peek_schedule()
            if head is None:
                return
            type, flags, _, n, _, length = head
            pos = cur.pos
            if state.state_counts is not None and logcounts.counted(type):
                rec = cur.decode_here()
                if rec is not None:
                    state.state_counts.delta(rec, self.segments.read_at)
            if type == R.ENVELOPE and n in state.replayed_clean:
                # a new message on the number of a finished one whose body recovery
                # has yet to remove: mess/S/n is the new message's now (recovery.py)
                state.replayed_clean = [m for m in state.replayed_clean if m != n]
            if (type == R.ENVELOPE and pos not in state.garbage
                    and not self.segments.flagged_garbage(flags, pos, length)):
                if n not in state.pending_new:
                    state.pending_new[n] = pos
                    self.garbage.count(pos, 1)
            cur.skip(length)
            if state.state_counts is not None:
                state.state_counts.pos = cur.pos

    def preprocess_batch(self, numbers, route, announce=None):
        """As the base class, but `new msg` and `info msg` are announced before the
        PREPROCESSED record is appended: a crash may then repeat them, never lose them
        (qmail logs both before todo/ is cleaned)."""
        results = []
        for n in numbers:
            try:
                results.append((n, self.preprocess(n, route, announce)))
            except QueueError as e:
                results.append((n, e))
        return results

    def preprocess(self, n, route, announce=None):
        state = self.state
        pos = state.pending_new.get(n)
        if pos is None:
            raise QueueError("unable to open todo/%d" % n)
        env = self.segments.read_at(pos)
        if env.type != R.ENVELOPE or env.n != n:
            del state.pending_new[n]
            raise QueueError("unable to open todo/%d" % n)
        mess = relpath("mess", n)
        try:
            st = os.stat(os.path.join(state.queue, mess))
        except OSError:
            raise QueueError("unable to stat %s" % mess)
        size = st.st_size
        now = _now()
        try:
            data, channels = preprocessed(env, pos, size, route, now, hold_asked(st.st_mode))
        except SetAside:
            # its ENVELOPE stays live and untouched, found again (and set aside again) at
            # the next start; qmailctl queue delete removes it.
            state.set_aside[n] = pos
            raise
        if announce is not None:
            announce(logline.new_msg(n))
            announce(logline.info_msg(n, size, env.sender, env.qp, env.uid))
        spos = self.segments.append(data)
        del state.pending_new[n]
        self.garbage.supersede(pos)
        self.garbage.count(spos, 1)
        a = InFlight(n, spos, self.segments.read_at(spos))
        a.offered = set(a.channels) or {None}
        state.active[n] = a
        return Preprocessed(n, env.sender, size, env.qp, env.uid, now,
                            tuple(c for c in CHANNELS if c in channels))
