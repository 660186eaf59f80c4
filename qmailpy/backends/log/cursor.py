"""Cursors over the log backend's segments, and the queue runners built on them.

A cursor reads records forward from a position, across segments, never past the
committed end of the head. A runner is a cursor that walks the log a fixed lag
behind the head and remembers (due, position) of snapshots it passed before they
were due (runners.py explains how runners find work).

Interface: Cursor(segments, pos) reads through `segments` (Segments, segments.py,
or a reader's quiet stand-in, readers.py): segment_fd(), next_segment(), writer.head()
and problem() for a damaged stretch met on the way. Runner holds a cursor and its
heap. Neither writes anything.
"""
import heapq
import os

from qmailpy.backends.log import records as R

_CHUNK = 256 * 1024


class Cursor:
    """Reads records forward from a position, a buffer at a time, across segments."""

    def __init__(self, segments, pos):
        self.segments = segments
        self.seg, self.off = pos
        self.buf, self.buf_off = b"", 0

    @property
    def pos(self):
        return (self.seg, self.off)

    def invalidate(self):
        self.buf, self.buf_off = b"", 0

    def _locate(self):
        """(buffer, offset in it, length) of the valid record at the cursor, or None."""
        while True:
            rel = self.off - self.buf_off
            if 0 <= rel < len(self.buf):
                length = R.frame_length(self.buf, rel)
                if length is not None:
                    return self.buf, rel, length
            fd = self.segments.segment_fd(self.seg)
            size = os.fstat(fd).st_size if fd is not None else 0
            head, end = self.segments.writer.head()
            if self.seg == head:
                # Never past the committed end: beyond it lie records being written, or
                # the remains of an appender that died, which the next appender overwrites.
                size = min(size, end)
            if self.off >= size:
                nxt = self.segments.next_segment(self.seg)
                if nxt is None or fd is not None and self.seg == head:
                    return None
                self.seg, self.off = nxt, R.HEADER_SIZE
                self.invalidate()
                continue
            data = os.pread(fd, min(_CHUNK, size - self.off), self.off)
            self.buf, self.buf_off = data, self.off
            if R.frame_length(data, 0) is not None:
                continue
            # Incomplete in the buffer, growing, torn or corrupt: look at the rest.
            rest = os.pread(fd, size - self.off, self.off)
            if R.frame_length(rest, 0) is not None:
                self.buf = rest
                continue
            resume = R._resync(rest, 1)
            if resume is None:
                if self.seg == head:
                    return None          # a torn tail: recovery cuts it
                self.segments.problem(R.Problem(R.TORN, self.seg, self.off, size), rest)
                self.off = size
            else:
                self.segments.problem(R.Problem(R.CORRUPT, self.seg, self.off, self.off + resume),
                                rest[:resume])
                self.off += resume
            self.invalidate()

    def peek(self):
        """The decoded record at the cursor, or None when no complete record is there yet."""
        while True:
            found = self._locate()
            if found is None:
                return None
            buf, rel, length = found
            rec = R.decode_one(buf, rel)
            if rec is not None:
                rec.pos = (self.seg, self.off)
                return rec
            self.segments.problem(R.Problem(R.CORRUPT, self.seg, self.off, self.off + length),
                            buf[rel:rel + length])
            self.off += length

    def decode_here(self):
        """The decoded record at the cursor, or None; unlike peek(), never moves past a
        record that does not decode (callers go on with skip())."""
        found = self._locate()
        if found is None:
            return None
        buf, rel, _ = found
        rec = R.decode_one(buf, rel)
        if rec is not None:
            rec.pos = (self.seg, self.off)
        return rec

    def peek_schedule(self):
        """(type, flags, time, n, dues, length) of the record at the cursor, or None."""
        found = self._locate()
        if found is None:
            return None
        buf, rel, length = found
        return R.schedule(buf, rel) + (length,)

    def advance(self, rec):
        self.off = rec.pos[1] + rec.length

    def skip(self, length):
        self.off += length


class Runner:
    __slots__ = ("lag", "cursor", "wake", "held", "parked")

    def __init__(self, lag, cursor):
        self.lag, self.cursor, self.wake = lag, cursor, 0
        self.held = []               # heap of (due, position) of snapshots it owns and passed
        self.parked = False          # stopped at a record it cannot pass before `wake`

    def idle(self, now, tail):
        """True when a walk now could find nothing: nothing held is due, and the cursor
        is parked before `wake` or waits at a tail that has not moved."""
        if self.wake and self.wake <= now:
            return False
        return self.parked or self.cursor.pos == tail

    def hold(self, due, pos):
        heapq.heappush(self.held, (due, pos))
        self.wait_until(due)

    def wait_until(self, when):
        self.wake = min(self.wake, when) if self.wake else when

    def restart_pos(self):
        return min([self.cursor.pos] + [pos for _, pos in self.held])

