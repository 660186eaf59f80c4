"""qmail-send's per-channel state: the work handed out to it, the current pass, the slots.

The heap holds (due, n) of passes the backend handed out as due (backends/base.py),
plus qmail-send's own retries after an error; the schedule of waiting messages is
the backend's. Everything else exists only for messages being delivered.
"""
import heapq

from qmailpy.spawn import ReplyReader


class Job:
    """One pass over one channel file of one message, plus its deliveries in flight."""
    __slots__ = ("n", "retry", "sender", "numtodo", "hiteof", "dying", "refs", "birth", "only",
                 "unstarted", "held")

    def __init__(self, n, retry, sender, dying, birth=0):
        self.n, self.retry, self.sender, self.dying = n, retry, sender, dying
        self.numtodo = 0
        self.hiteof = False
        self.refs = 1
        self.birth = birth
        self.only = None        # a pass woken by the throttle gate: the record indexes it starts
        self.unstarted = 0      # pending records such a pass left alone
        self.held = []          # (index, domain, due) the gate held back (send/throttle.py)


class Delivery:
    __slots__ = ("d", "job", "record")

    def __init__(self, d, job, record):
        self.d, self.job, self.record = d, job, record


class Channel:
    def __init__(self, name, cmd_fd, reply_fd, concurrency):
        self.name = name
        self.cmd_fd, self.reply_fd = cmd_fd, reply_fd
        self.concurrency = concurrency
        self.slots = [None] * concurrency
        self.used = 0
        self.alive = True
        self.reader = ReplyReader()
        self.outbuf = b""               # at most one command waiting to be written
        self.heap = []                  # (due, n) handed out by backend.due(), or retries
        self.job = None                 # the current pass
        self.records = None
        self.index = 0

    # -- handed-out work -----------------------------------------------------
    def schedule(self, due, n):
        heapq.heappush(self.heap, (due, n))

    def next_due(self):
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now):
        if self.heap and self.heap[0][0] <= now:
            return heapq.heappop(self.heap)[1]
        return None

    def run_all_now(self, now):
        """SIGALRM: every scheduled entry is due now."""
        self.heap = [(now, n) for _, n in self.heap]
        heapq.heapify(self.heap)

    # -- slots ---------------------------------------------------------------
    def can_write(self):
        return not self.outbuf

    def available(self):
        return self.alive and not self.outbuf and self.used < self.concurrency

    def free_slot(self):
        for i, d in enumerate(self.slots):
            if d is None:
                return i
        return None
