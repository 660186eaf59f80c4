"""The directory backend's schedule: when each waiting channel of each message is next due.

qmail keeps this in memory, one (due, n) per waiting channel file, loaded at
startup from the channel files' mtimes (docs/qmail-send.md "Startup") and written
back to them at each retry and at exit (docs/qmail-send.md "Scheduling and
retries"). DirQueue owns it and offers its entries through due(), as
base.QueueBackend describes; qmail-send only holds what it was offered.
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
        self.rechecks = []                          # heap of (due, n)
        self.completions = []                       # n found with no channel left, due now

    def __len__(self):
        return sum(len(h) for h in self.heaps.values()) + len(self.rechecks) + len(self.completions)

    def add(self, entry):
        if entry.channel is None:
            self.completions.append(entry.n)
        elif entry.channel == RECHECK:
            heapq.heappush(self.rechecks, (entry.due, entry.n))
        else:
            heapq.heappush(self.heaps[entry.channel], (entry.due, entry.n))

    def due(self, now, rescan):
        """Entries due at `now`, removed from the schedule; rescan(n, now) re-reads a RECHECK."""
        while self.rechecks and self.rechecks[0][0] <= now:
            _, n = heapq.heappop(self.rechecks)
            for entry in rescan(n, now):
                self.add(entry)
        found = [Scheduled(n, None, now) for n in self.completions]
        self.completions = []
        for c in CHANNELS:
            heap = self.heaps[c]
            while heap and heap[0][0] <= now:
                due, n = heapq.heappop(heap)
                found.append(Scheduled(n, c, due))
        return found

    def next_wakeup(self, now):
        if self.completions:
            return now
        tops = [h[0][0] for h in list(self.heaps.values()) + [self.rechecks] if h]
        return min(tops) if tops else None

    def run_all_now(self, now):
        """SIGALRM: every waiting channel is due now (rechecks keep their time)."""
        for c in CHANNELS:
            heap = self.heaps[c]
            self.heaps[c] = [(now, n) for _, n in heap]
            heapq.heapify(self.heaps[c])

    def take(self, n):
        """Remove message n's entries from the schedule and return them (a command on n;
        one pass over the heaps)."""
        taken = []
        for c in CHANNELS:
            heap = self.heaps[c]
            if any(m == n for _, m in heap):
                taken.extend(Scheduled(n, c, due) for due, m in heap if m == n)
                self.heaps[c] = [(due, m) for due, m in heap if m != n]
                heapq.heapify(self.heaps[c])
        if n in self.completions:
            self.completions = [m for m in self.completions if m != n]
            taken.append(Scheduled(n, None, 0))
        return taken

    def waiting(self):
        """(n, channel, due) of every waiting channel, for the orderly exit."""
        for c in CHANNELS:
            for due, n in self.heaps[c]:
                yield n, c, due
