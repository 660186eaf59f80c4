"""The log-structured queue backend (docs/architecture.md "Queue backends", after Tony Finch's log-structured MTA queue).

Message bodies stay in mess/ exactly as in the directory backend. Everything else
is records appended to segments under queue/log/ (format: log/records.py, man
qmail-log-queue(5)); appends and group commit: log/commit.py.

A message's S5 state is its latest *snapshot* (PREPROCESSED or REPLACEMENT: sender,
birth, both channels' recipients with done marks and next-attempt times, bounce
notes) plus the deltas appended after it (START, DELIVERY, BOUNCE-NOTE). Whenever
a message stops being worked on (a pass is rescheduled or a channel finished) a
REPLACEMENT folds the deltas into a new snapshot and the old one becomes garbage
(flag byte written in place). So a message nobody is working on is exactly one
live record, and qmail-send keeps in memory only messages in flight (`active`).

LogQueue is this module's delivery interface plus one mixin per concept:
  log/segments.py  LogSegments  segment files, reading a record, appending, damage reports
  log/garbage.py   LogGarbage   live counts per segment, deleting empty segments
  log/recovery.py  LogRecovery  checkpoints and recovery at startup
  log/damage.py    LogDamage    restoring messages whose newest record was damaged
  log/runners.py   LogRunners   the queue runners: due(), next_wakeup(), run_all_now()
  log/readers.py   LogReaders   qmail-qread/qmail-qstat readers and the 36-hour cleanup
  log/commands.py  LogCommands  hold, release, requeue and delete for qmail-send's commands
The schedule lives in the log itself (each snapshot's next-attempt times): the
runners offer what is due, as base.QueueBackend describes.
"""
import os

from qmailpy import logline
from qmailpy.backends.log import counts as logcounts, records as R
from qmailpy.backends.base import CleanerLost, Preprocessed, QueueBackend, QueueError, SetAside
from qmailpy.backends.log.commands import LogCommands
from qmailpy.backends.log.commit import LOG_DIR, SEGMENT_LIMIT_CONTROL, read_segment_limit
from qmailpy.backends.log.damage import LogDamage
from qmailpy.backends.log.garbage import LogGarbage
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.preprocess import preprocessed
from qmailpy.backends.log.readers import LogReaders
from qmailpy.backends.log.recovery import LogRecovery
from qmailpy.backends.log.runners import RUNNER_LAGS, LogRunners
from qmailpy.backends.log.segments import LogSegments, now as _now
from qmailpy.envelope import ChannelRecord
from qmailpy.layout import CHANNELS, SPLIT, relpath
from qmailpy.mess import hold_asked


class LogQueue(LogSegments, LogGarbage, LogRecovery, LogDamage, LogRunners, LogReaders, LogCommands,
               QueueBackend):
    name = "log"

    def __init__(self, home, cleaner=None, log=None, segment_limit=None,
                 runner_lags=RUNNER_LAGS):
        self.home = home
        self.queue = os.path.join(home, "queue")
        self.logdir = os.path.join(self.queue, LOG_DIR)
        self.cleaner = cleaner
        self._log = log
        if segment_limit is None:           # control/logsegmentsize, as qmail-queue reads it
            segment_limit = read_segment_limit(os.path.join(home, "control", SEGMENT_LIMIT_CONTROL))
        self.segment_limit = segment_limit
        self.runner_lags = tuple(runner_lags)
        self._writer = None
        self._fds = {}
        self.active = {}
        self.taken = {}               # n -> live snapshot position, found by a command's take()
        self.locators = []            # of the commands being carried out (log/locator.py)
        self.pending_new = {}
        self.set_aside = {}           # of pending_new, those preprocess() set aside: n -> position
        self.live = {}
        self.garbage = set()          # superseded positions whose flag is not yet written
        self.runners = []
        self.new_cursor = None
        self.problems = []            # Problems reported by this process
        self.damage = []              # damaged (segment, offset) whose stranded messages are not yet restored
        self._reported = set()
        self.last_checkpoint = 0
        self.recovered = False
        self.flusher = None           # (cursor, stop) of a run_all_now() sweep
        self.flush_again = False      # a SIGALRM came during that sweep: sweep once more
        self.to_clean = []            # finished messages whose mess/ file goes after the next fsync
        self.results_unsynced = False  # DELIVERY records appended since the last sync_results()
        self.replayed_clean = []      # FINISHes replayed by recovery: cleaned once no qmail-queue runs
        self.removed_unsynced = set()  # n % SPLIT of bodies removed since their mess/S/ was synced
        self.state_counts = None      # messages per state up to new_cursor (log/counts.py)

    def _write_snapshot(self, a, type=R.REPLACEMENT, ended=(), now=None):
        now = _now() if now is None else now
        try:
            data = R.encode_snapshot(type, now, a.n, a.snap, a.birth, a.qp, a.uid, a.size, a.sender,
                                     bytes(a.notes), ended, a.channel_state(), a.held)
        except R.RecordError as e:
            # beyond what qmailpy.queuelimits lets a message reach (a queue from before it):
            # the caller retries later, as after any other failed write, and lives on
            raise QueueError("unable to record message %d: %s" % (a.n, e)) from None
        pos = self._append(data)
        self._supersede(a.snap)
        self._count(pos, 1)
        a.snap, a.delta_start = pos, None
        return pos

    # -- startup (recovery: log/recovery.py) -----------------------------------------
    def startup(self):
        self.recover()
        return self.due(_now())

    # -- new work --------------------------------------------------------------
    def _scan_new(self):
        """Read what others appended since last time; remember unpreprocessed ENVELOPEs."""
        if self.new_cursor is None:
            self.recover()
        cur = self.new_cursor
        while True:
            head = cur.peek_schedule()
            if head is None:
                return
            type, flags, _, n, _, length = head
            pos = cur.pos
            if self.state_counts is not None and logcounts.counted(type):
                rec = cur.decode_here()
                if rec is not None:
                    self.state_counts.delta(rec, self._read_at)
            if type == R.ENVELOPE and n in self.replayed_clean:
                # a new message on the number of a finished one whose body recovery
                # has yet to remove: mess/S/n is the new message's now (log/recovery.py)
                self.replayed_clean = [m for m in self.replayed_clean if m != n]
            if (type == R.ENVELOPE and pos not in self.garbage
                    and not self._flagged_garbage(flags, pos, length)):
                if n not in self.pending_new:
                    self.pending_new[n] = pos
                    self._count(pos, 1)
            cur.skip(length)
            if self.state_counts is not None:
                self.state_counts.pos = cur.pos

    def new_work(self):
        try:
            self._scan_new()
        except OSError as e:
            raise QueueError("unable to read log: %s" % e.strerror)
        return [n for n in self.pending_new if n not in self.set_aside]

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
        pos = self.pending_new.get(n)
        if pos is None:
            raise QueueError("unable to open todo/%d" % n)
        env = self._read_at(pos)
        if env.type != R.ENVELOPE or env.n != n:
            del self.pending_new[n]
            raise QueueError("unable to open todo/%d" % n)
        mess = relpath("mess", n)
        try:
            st = os.stat(os.path.join(self.queue, mess))
        except OSError:
            raise QueueError("unable to stat %s" % mess)
        size = st.st_size
        now = _now()
        try:
            data, channels = preprocessed(env, pos, size, route, now, hold_asked(st.st_mode))
        except SetAside:
            # its ENVELOPE stays live and untouched, found again (and set aside again) at
            # the next start; qmailctl queue delete removes it.
            self.set_aside[n] = pos
            raise
        if announce is not None:
            announce(logline.new_msg(n))
            announce(logline.info_msg(n, size, env.sender, env.qp, env.uid))
        spos = self._append(data)
        del self.pending_new[n]
        self._supersede(pos)
        self._count(spos, 1)
        a = InFlight(n, spos, self._read_at(spos))
        a.offered = set(a.channels) or {None}
        self.active[n] = a
        return Preprocessed(n, env.sender, size, env.qp, env.uid, now,
                            tuple(c for c in CHANNELS if c in channels))


    # -- deliveries ------------------------------------------------------------------
    def _get(self, n):
        a = self.active.get(n)
        if a is None:
            raise QueueError("message %d is not in flight" % n)
        return a

    def message_path(self, n):
        return "%d/%d" % (n % SPLIT, n)

    def info(self, n):
        a = self._get(n)
        return a.sender, a.birth

    def recipients(self, n, channel):
        a = self.active.get(n)
        if a is None or channel not in a.channels:
            raise QueueError("trouble opening %s; will try again later" % self.channel_file(n, channel))
        if channel not in a.passes:
            pos = self._append(R.encode_start(_now(), n, a.snap, channel))
            a.passes.add(channel)
            a.offered.add(channel)
            if a.delta_start is None:
                a.delta_start = pos
        return [ChannelRecord(i, bool(done), addr) for i, (done, addr) in enumerate(a.channels[channel][1])]

    def mark_done(self, n, channel, record):
        a = self._get(n)
        result = R.FAILURE if a.failed else R.SUCCESS
        # durable at sync_results(), once per batch of reports (qmail-send's group commit)
        pos = self._append(R.encode_delivery(_now(), n, channel, record.offset, result))
        self.results_unsynced = True
        if a.delta_start is None:
            a.delta_start = pos
        a.channels[channel][1][record.offset][0] = True
        a.failed = False
        record.done = True

    def sync_results(self):
        if not self.results_unsynced:
            return
        try:
            self.writer.sync_all()
        except OSError as e:
            raise QueueError("trouble syncing the log: %s" % e.strerror)
        self.results_unsynced = False

    def add_bounce_note(self, n, note):
        # Durable before the DELIVERY that marks the recipient done: a disk that kept
        # the DELIVERY and lost the note (unsynced writes in any order) ends the
        # message without its bounce. Failures are rare; the fsync is cheap here.
        a = self._get(n)
        pos = self._append(R.encode_bounce_note(_now(), n, R.NOTE_ADD, note), durable=True)
        if a.delta_start is None:
            a.delta_start = pos
        a.notes += note
        a.failed = True

    def _settle(self, a):
        if not a.offered and not a.passes:
            del self.active[a.n]

    def finish_channel(self, n, channel):
        a = self._get(n)
        state = a.channels.pop(channel, None)
        try:
            self._write_snapshot(a, ended=(channel,))
        except QueueError:
            # Not written (a full disk): the channel stays as it was, so the retry
            # qmail-send schedules opens it again instead of finding nothing to open.
            if state is not None:
                a.channels[channel] = state
            raise
        a.passes.discard(channel)
        a.offered.discard(channel)
        if not a.channels:
            a.offered.add(None)                  # qmail-send schedules completion next
        left = [c for c in CHANNELS if c in a.channels]
        self._settle(a)                          # out of flight if the others wait for a retry
        return left

    def reschedule(self, n, channel, when):
        """Write the REPLACEMENT: the runners offer it again at `when`."""
        a = self._get(n)
        if channel in a.channels:
            a.channels[channel][0] = int(when)
        a.passes.discard(channel)
        self._write_snapshot(a, ended=(channel,))
        a.offered.discard(channel)
        self._settle(a)

    def channels_left(self, n):
        return [c for c in CHANNELS if c in self._get(n).channels]

    def completion_due(self, n):
        a = self.active.get(n)
        return a is not None and not a.channels

    # -- completion ----------------------------------------------------------------------
    def bounce_notes(self, n):
        a = self._get(n)
        return bytes(a.notes) if a.notes else None

    def drop_bounce_notes(self, n):
        """The bounce is queued: a fresh snapshot without the notes replaces the old one.

        (A bare NOTE_CLEAR after the message's last snapshot is not replayed for a
        message that is no longer in flight, so a crash before FINISH would send
        the bounce again.)"""
        a = self._get(n)
        a.notes = bytearray()
        self._write_snapshot(a)

    def complete(self, n):
        """FINISH now; the mess file goes at the next checkpoint, once FINISH is on disk.

        (Unlinking it first could leave, after a power cut, a live message whose body
        is gone.) A number that is not in flight is a stale leftover: cleaned at once."""
        a = self.active.pop(n, None)
        if a is None:
            self._clean(n)
            return
        self._append(R.encode_finish(_now(), n, a.snap))
        self._supersede(a.snap)
        self.to_clean.append(n)

    def _clean(self, n):
        self.removed_unsynced.add(n % SPLIT)
        foop = "foop/%d" % n
        if self.cleaner is not None:
            if self.cleaner.request(foop) != b"+":
                self._warn("qmail-clean unable to clean up %s" % foop)
            return
        try:
            os.unlink(os.path.join(self.queue, relpath("mess", n)))
        except FileNotFoundError:
            pass
        except OSError:
            self._warn("qmail-clean unable to clean up %s" % foop)

    def save_schedule(self, entries):
        touched = {}
        for n, channel, when in entries:
            a = self.active.get(n)
            if a is not None and channel in a.channels:
                a.channels[channel][0] = int(when)
                touched[n] = a
        for a in touched.values():
            try:
                self._write_snapshot(a)
            except QueueError as e:       # its older snapshot stays: due at that one's time
                self._warn(str(e))
        try:
            self.checkpoint(force=True)
        except CleanerLost:
            pass                              # exiting anyway; recovery cleans up

