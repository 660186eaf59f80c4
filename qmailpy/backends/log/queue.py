"""The log-structured queue backend (docs/architecture.md "Queue backends", after Tony Finch's log-structured MTA queue).

Message bodies stay in mess/ exactly as in the directory backend. Everything else
is records appended to segments under queue/log/ (format: records.py, man
qmail-log-queue(5)); appends and group commit: commit.py.

A message's S5 state is its latest *snapshot* (PREPROCESSED or REPLACEMENT: sender,
birth, both channels' recipients with done marks and next-attempt times, bounce
notes) plus the deltas appended after it (START, DELIVERY, BOUNCE-NOTE). Whenever
a message stops being worked on (a pass is rescheduled or a channel finished) a
REPLACEMENT folds the deltas into a new snapshot and the old one becomes garbage
(flag byte written in place). So a message nobody is working on is exactly one
live record, and qmail-send keeps in memory only messages in flight (`active`).

LogQueue is the facade qmail-send, qmailctl, the conversion and the readers use
(the interface is base.QueueBackend). It owns one LogState (state.py: everything
qmail-send keeps in memory about the log) and hands it to its parts, each taking
the other parts it needs explicitly (each part module states what it reads,
writes and owns):
  segments.py    Segments         segment fds and the LogWriter: reading, appending, damage reports
  garbage.py     Garbage          new snapshots superseding old ones, live counts, removing
                                  bodies and empty segments
  newwork.py     NewWork          ENVELOPEs appended by qmail-queue, and their preprocessing
  readers.py     Readers          qmail-qread/qmail-qstat readers and the 36-hour cleanup
  damage.py      DamageRestorer   restoring messages whose newest record was damaged
  recovery.py    Recovery         checkpoints, and recovery at startup
  deliveries.py  Deliveries       a message in flight: its passes, results, bounce notes, completion
  runners.py     Runners          the queue runners: due(), next_wakeup(), run_all_now()
  commands.py    Commands         hold, release, requeue and delete for qmail-send's commands
The schedule lives in the log itself (each snapshot's next-attempt times): the
runners offer what is due, as base.QueueBackend describes.
"""
import os

from qmailpy.backends.base import QueueBackend, QueueError
from qmailpy.backends.log.commands import Commands
from qmailpy.backends.log.commit import SEGMENT_LIMIT_CONTROL, read_segment_limit
from qmailpy.backends.log.damage import DamageRestorer
from qmailpy.backends.log.deliveries import Deliveries
from qmailpy.backends.log.garbage import Garbage
from qmailpy.backends.log.newwork import NewWork
from qmailpy.backends.log.readers import Readers
from qmailpy.backends.log.recovery import Recovery
from qmailpy.backends.log.runners import RUNNER_LAGS, Runners
from qmailpy.backends.log.segments import Segments
from qmailpy.backends.log.state import LogState, now as _now
from qmailpy.layout import SPLIT


class LogQueue(QueueBackend):
    name = "log"

    def __init__(self, home, cleaner=None, log=None, segment_limit=None,
                 runner_lags=RUNNER_LAGS):
        self.home = home
        self.queue = os.path.join(home, "queue")
        if segment_limit is None:           # control/logsegmentsize, as qmail-queue reads it
            segment_limit = read_segment_limit(os.path.join(home, "control", SEGMENT_LIMIT_CONTROL))
        state = self.state = LogState(self.queue, cleaner, log, segment_limit, runner_lags)
        self.logdir = state.logdir
        self.segments = Segments(state)
        self.garbage = Garbage(state, self.segments)
        self.newwork = NewWork(state, self.segments, self.garbage)
        self.readers = Readers(state, self.segments)
        self.restorer = DamageRestorer(state, self.segments, self.garbage, self.readers)
        self.recovery = Recovery(state, self.segments, self.garbage, self.newwork, self.restorer)
        self.deliveries = Deliveries(state, self.segments, self.garbage, self.recovery)
        self.runners = Runners(state, self.segments, self.recovery)
        self.commands = Commands(state, self.segments, self.garbage, self.recovery, self.deliveries)

    @property
    def cleaner(self):
        return self.state.cleaner

    def close(self):
        self.segments.close()

    # -- startup, recovery and checkpoints (recovery.py) ------------------------------
    def startup(self):
        self.recovery.recover()
        return self.runners.due(_now())

    def recover(self):
        self.recovery.recover()

    def checkpoint(self, force=False, now=None):
        self.recovery.checkpoint(force, now)

    # -- new work (newwork.py) ----------------------------------------------------------
    def new_work(self):
        try:
            self.recovery.scan_new()
        except OSError as e:
            raise QueueError("unable to read log: %s" % e.strerror)
        return [n for n in self.state.pending_new if n not in self.state.set_aside]

    def preprocess(self, n, route, announce=None):
        return self.newwork.preprocess(n, route, announce)

    def preprocess_batch(self, numbers, route, announce=None):
        return self.newwork.preprocess_batch(numbers, route, announce)

    # -- the schedule (runners.py) --------------------------------------------------------
    def due(self, now=None):
        return self.runners.due(now)

    def next_wakeup(self):
        return self.runners.next_wakeup()

    def run_all_now(self):
        self.runners.run_all_now()

    # -- deliveries and completion: the base class forwards them to deliveries.py ------------
    def message_path(self, n):
        return "%d/%d" % (n % SPLIT, n)

    def sync_results(self):
        self.deliveries.sync_results()

    # -- commands (commands.py) -------------------------------------------------------------
    def locate(self, numbers):
        return self.commands.locate(numbers)

    def forget(self, locator):
        self.commands.forget(locator)

    def take(self, numbers, locator=None):
        return self.commands.take(numbers, locator)

    def bring(self, n):
        return self.commands.bring(n)

    def let_go(self, n):
        self.commands.let_go(n)

    def commit(self):
        self.commands.commit()

    def is_set_aside(self, n):
        return self.commands.is_set_aside(n)

    def delete_queued(self, n):
        self.commands.delete_queued(n)

    def is_held(self, n):
        return self.commands.is_held(n)

    def hold(self, n):
        self.commands.hold(n)

    def release(self, n):
        self.commands.release(n)

    def requeue(self, n, now):
        self.commands.requeue(n, now)

    def delete(self, n):
        self.commands.delete(n)

    # -- readers (readers.py) -----------------------------------------------------------------
    def stale_messages(self, now):
        return self.readers.stale_messages(now)

    def scan(self, report=True):
        return self.readers.scan(report)

    def latest_states(self):
        return self.readers.latest_states()

    def stream_states(self):
        return self.readers.stream_states()

    def current_counts(self):
        return self.readers.current_counts()

    def list_messages(self):
        return self.readers.list_messages()

    def counts(self):
        return self.readers.counts()
