"""Where the messages a command names are in the log (commands.py; docs/log-queue.md
"Held messages"): the log has no index by number, so qmail-send finds them by walking it.

A Locator holds the command's numbers (ascending, an array of 8 bytes each) and, for
each, the position of the newest snapshot or FINISH seen for it: 17 bytes a message
however long the command, never the records. step() walks on from the oldest
segment, reading only each record's fixed prefix, WALK_STEP records at a time, so
qmail-send goes on delivering between steps; the walk is done at the end of the log.
qmail-send's own appends (the only snapshots and FINISHes written while it runs)
are noted as they are made, before and after the walk passes them: of two records,
the later one in the log is the newer, whichever was noted first.

Interface: Locator(segments, numbers) reads the log through `segments` (Segments,
segments.py) with its own Cursor; Segments.append calls note() for qmail-send's own
appends while the locator is in state.locators (commands.py adds and removes it).
Writes nothing; owns its arrays and cursor.
"""
from array import array
from bisect import bisect_left

from qmailpy.backends.log import records as R
from qmailpy.backends.log.cursor import Cursor

WALK_STEP = 5000            # records a step reads
_NONE, _SNAPSHOT, _FINISHED = 0, 1, 2


class Locator:
    def __init__(self, segments, numbers):
        self.numbers = numbers
        size = len(numbers)
        self.segs = array("q", bytes(8 * size))
        self.offs = array("q", bytes(8 * size))
        self.kinds = array("b", bytes(size))
        found = segments.segments() if size else None
        self.cursor = Cursor(segments, (found[0], R.HEADER_SIZE)) if found else None
        self.low, self.high = (numbers[0], numbers[-1]) if size else (1, 0)

    def _index(self, n):
        if n < self.low or n > self.high:
            return None
        i = bisect_left(self.numbers, n)
        return i if self.numbers[i] == n else None

    def note(self, type, n, pos):
        """A record of message n at pos: the newest so far if it is later in the log."""
        if type in R.SNAPSHOTS:
            kind = _SNAPSHOT
        elif type == R.FINISH:
            kind = _FINISHED
        else:
            return
        i = self._index(n)
        if i is None or self.kinds[i] and (self.segs[i], self.offs[i]) > pos:
            return
        self.segs[i], self.offs[i] = pos
        self.kinds[i] = kind

    def step(self, budget=WALK_STEP):
        """Walk on; True once the walk has reached the end of the log."""
        cur = self.cursor
        if cur is None:
            return True
        for _ in range(budget):
            head = cur.peek_schedule()
            if head is None:
                self.cursor = None
                return True
            self.note(head[0], head[3], cur.pos)
            cur.skip(head[5])
        return False

    def where(self, n):
        """The position of n's newest snapshot, or None (none seen, or a FINISH after it)."""
        i = self._index(n)
        if i is None or self.kinds[i] != _SNAPSHOT:
            return None
        return self.segs[i], self.offs[i]
