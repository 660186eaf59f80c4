"""The directory backend's schedule: when each waiting channel of each message is next due.

qmail keeps this in memory, one (due, n) per waiting channel file, loaded at
startup from the channel files' mtimes (docs/qmail-send.md "Startup") and written
back to them at each retry and at exit (docs/qmail-send.md "Scheduling and
retries"). DirState (state.py) owns it; DirQueue offers its entries through due(),
as base.QueueBackend describes; qmail-send only holds what it was offered. Reads and
writes no file: the channel files' mtimes are state.py's and deliveries.py's.

`index` holds the due time of each waiting (channel, n): a heap entry that does not
match it was taken out (a command on the message, take()) and is skipped when it
comes up, so taking is O(1) however long the queue; the heaps are rebuilt once
they hold more taken entries than live ones.
"""
import heapq

from qmailpy.backends.base import Scheduled
from qmailpy.layout import CHANNELS

# Scheduled.channel for a message whose startup scan could not read one of its
# files (a stat error other than ENOENT): at `due` it is scanned again.
RECHECK = "recheck"


class DirSchedule:
    def __init__(self):
        self.heaps = {c: [] for c in CHANNELS}      # channel -> heap of (due, n)
        self.index = {}                             # (channel, n) -> due of its live entry
        self.taken = 0                              # heap entries no longer in index
        self.rechecks = []                          # heap of (due, n)
        self.completions = []                       # n found with no channel left, due now

    def __len__(self):
        return len(self.index) + len(self.rechecks) + len(self.completions)

    def add(self, entry):
        if entry.channel is None:
            self.completions.append(entry.n)
        elif entry.channel == RECHECK:
            heapq.heappush(self.rechecks, (entry.due, entry.n))
        else:
            key = (entry.channel, entry.n)
            if key in self.index:
                self.taken += 1
            self.index[key] = entry.due
            heapq.heappush(self.heaps[entry.channel], (entry.due, entry.n))

    def due(self, now, rescan):
        """Entries due at `now`, removed from the schedule; rescan(n, now) re-reads a RECHECK."""
        while self.rechecks and self.rechecks[0][0] <= now:
            _, n = heapq.heappop(self.rechecks)
            for entry in rescan(n, now):
                self.add(entry)
        found = [Scheduled(n, None, now) for n in self.completions]
        self.completions = []
        index = self.index
        for c in CHANNELS:
            heap = self.heaps[c]
            while heap and heap[0][0] <= now:
                due, n = heapq.heappop(heap)
                if index.get((c, n)) != due:
                    self.taken -= 1
                    continue
                del index[(c, n)]
                found.append(Scheduled(n, c, due))
        return found

    def next_wakeup(self, now):
        if self.completions:
            return now
        for c in CHANNELS:
            heap = self.heaps[c]
            while heap and self.index.get((c, heap[0][1])) != heap[0][0]:
                heapq.heappop(heap)
                self.taken -= 1
        tops = [h[0][0] for h in list(self.heaps.values()) + [self.rechecks] if h]
        return min(tops) if tops else None

    def run_all_now(self, now):
        """SIGALRM: every waiting channel is due now (rechecks keep their time)."""
        for key in self.index:
            self.index[key] = now
        self._rebuild()

    def _rebuild(self):
        """Heaps of the live entries only."""
        self.heaps = {c: [] for c in CHANNELS}
        for (c, n), due in self.index.items():
            self.heaps[c].append((due, n))
        for heap in self.heaps.values():
            heapq.heapify(heap)
        self.taken = 0

    def take(self, n):
        """Remove message n's entries from the schedule and return them (a command on n)."""
        taken = []
        for c in CHANNELS:
            due = self.index.pop((c, n), None)
            if due is not None:
                taken.append(Scheduled(n, c, due))
                self.taken += 1
        if self.taken > len(self.index) + 1024:
            self._rebuild()
        if n in self.completions:
            self.completions = [m for m in self.completions if m != n]
            taken.append(Scheduled(n, None, 0))
        return taken

    def drop(self, n, channel):
        """Message n's entry for channel, if it waits, leaves the schedule (its file is gone:
        qmailctl queue bounce finishes channels whose retry was still ahead)."""
        if self.index.pop((channel, n), None) is not None:
            self.taken += 1
            if self.taken > len(self.index) + 1024:
                self._rebuild()

    def waiting(self):
        """(n, channel, due) of every waiting channel, for the orderly exit."""
        for (c, n), due in self.index.items():
            yield n, c, due
