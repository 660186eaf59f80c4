"""The directory queue backend: qmail's own layout, byte for byte (docs/queue-format.md
"Queue directory layout"; docs/queue-format.md "File formats").

Every file name, record and order of operations here is qmail's, so a queue
written by this backend can be run by C qmail and the other way round. The
texts of QueueError are qmail-send's warning texts (without "warning: "),
naming the file relative to the queue directory.

DirQueue is the facade qmail-send, qmailctl and the conversion use (the interface
is base.QueueBackend). It owns one DirState (state.py: the paths, qmail-clean's
client, the warnings and all per-message memory) and hands it to its parts, each
taking what it needs explicitly:

  schedule.py    DirSchedule     when each waiting channel is next due (in state.schedule)
  holds.py       DirHolds        hold/n markers; parking a held message's entries
  scan.py        DirScanner      the startup scan and the 36-hour cleanup walk
  preprocess.py  DirPreprocessor todo/n -> info/S/n and the channel files (S4 -> S5)
  deliveries.py  DirDeliveries   reading and marking channel files, bounce notes, completion
  commands.py    DirCommands     take, requeue, delete, delete_queued, commit
  listing.py                     qmail-qread/qmail-qstat's read-only view

State lives in the files; the only per-message memory is the schedule (one
(due, n) per waiting channel, as qmail) and the hold markers. todo/, intd/ and
mess/ are only ever unlinked by qmail-clean, through the cleaner.
"""
import os

from qmailpy.backends.base import QueueBackend, QueueError
from qmailpy.backends.dir import listing
from qmailpy.backends.dir.commands import DirCommands
from qmailpy.backends.dir.deliveries import DirDeliveries
from qmailpy.backends.dir.holds import DirHolds
from qmailpy.backends.dir.preprocess import DirPreprocessor
from qmailpy.backends.dir.scan import DirScanner
from qmailpy.backends.dir.state import DirState, now as _now, rel
from qmailpy.layout import SPLIT, is_number


class DirQueue(QueueBackend):
    name = "dir"

    def __init__(self, home, cleaner=None, log=None):
        self.home = home
        self.queue = os.path.join(home, "queue")
        self.state = DirState(self.queue, cleaner, log)
        self.holds = DirHolds(self.state)
        self.scanner = DirScanner(self.state, self.holds)
        self.preprocessor = DirPreprocessor(self.state, self.scanner)
        self.deliveries = DirDeliveries(self.state, self.holds)
        self.commands = DirCommands(self.state, self.holds, self.deliveries)
        if cleaner is not None and hasattr(cleaner, "send_async"):
            cleaner.on_late_reply = self.deliveries.late_clean_reply

    @property
    def cleaner(self):
        return self.state.cleaner

    @property
    def schedule(self):
        return self.state.schedule

    # -- startup, new work and the schedule ------------------------------------
    def startup(self):
        """Load the schedule from info/ and the channel files' mtimes; offer what is due."""
        now = _now()
        self.holds.load()
        self.scanner.load(now)
        return self.due(now)

    def due(self, now=None):
        now = _now() if now is None else now
        return self.holds.park(self.state.schedule.due(now, self.scanner.scan_one))

    def next_wakeup(self):
        wakeups = [self.state.schedule.next_wakeup(_now()), self.deliveries.completions_wakeup()]
        wakeups = [w for w in wakeups if w is not None]
        return min(wakeups) if wakeups else None

    def flush_completions(self):
        return self.deliveries.flush_completions()

    def run_all_now(self):
        self.state.schedule.run_all_now(_now())

    def new_work(self):
        try:
            names = os.listdir(self.state.path("todo"))
        except OSError as e:
            raise QueueError("unable to opendir todo: %s" % e.strerror)
        return [int(name) for name in names if is_number(name)]

    def preprocess(self, n, route, announce=None):
        return self.preprocessor.preprocess(n, route, announce)

    def preprocess_batch(self, numbers, route, announce=None):
        return self.preprocessor.preprocess_batch(numbers, route, announce)

    # -- deliveries and completion: the base class forwards them to deliveries.py ---
    def message_path(self, n):
        return "%d/%d" % (n % SPLIT, n)

    def channel_file(self, n, channel):
        """The channel file's name relative to the queue, for log lines."""
        return rel(channel, n)

    def stale_messages(self, now):
        return self.scanner.stale_messages(now)

    # -- commands (commands.py, holds.py) ----------------------------------------
    def take(self, numbers, locator=None):
        return self.commands.take(numbers)

    def bring(self, n):
        return True                 # its files are the message: nothing to load

    def let_go(self, n):
        pass

    def is_held(self, n):
        return self.holds.is_held(n)

    def hold(self, n):
        self.holds.hold(n)

    def release(self, n):
        self.holds.release(n)

    def requeue(self, n, now):
        self.commands.requeue(n, now)

    def delete(self, n):
        self.commands.delete(n)

    def delete_queued(self, n):
        self.commands.delete_queued(n)

    def commit(self):
        self.commands.commit()

    # -- readers (listing.py) ----------------------------------------------------
    def list_messages(self):
        return listing.list_messages(self.queue)

    def counts(self):
        return listing.counts(self.queue)
