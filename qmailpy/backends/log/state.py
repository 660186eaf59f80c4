"""The log backend's shared state: one LogState a LogQueue, handed to each part.

It holds everything qmail-send keeps in memory about the log, so that no part
keeps a fact another part needs; each part module says which of these it reads
and which it writes. Reads and writes no file.

Configuration: queue (the queue directory), logdir (queue/log), cleaner
(qmail-clean's client, or None: bodies are unlinked directly), log (the warning
and log-line sink: bytes -> None, or None), segment_limit, runner_lags.

Messages: active (n -> InFlight, inflight.py: the messages being worked on),
pending_new (n -> position of an ENVELOPE not yet preprocessed), set_aside (of
pending_new, those preprocessing set aside: n -> position), taken (n -> live
snapshot position found by a command's take()), locators (the commands' walks,
locator.py: every append is noted to them), replayed_state (recovery: n -> its
newest ENVELOPE or snapshot replayed), lost_starts (recovery: n -> (position, channels)
of STARTs naming a snapshot that is lost).

Garbage: live (segment -> live records), garbage (superseded positions whose flag
is not yet written), to_clean (finished messages whose body goes after the next
checkpoint), replayed_clean (FINISHes recovery replayed: cleaned once no
qmail-queue runs), removed_unsynced (n % 23 of bodies removed since their mess/S/
was synced).

Reading: new_cursor (where new work is read from), runners (runners.py),
flusher ((cursor, stop) of a run_all_now() sweep) and flush_again, state_counts
(counts.py: messages per state up to new_cursor), problems (Problems reported by
this process), reported ((segment, start) already reported), damage (damaged
(segment, offset) whose stranded messages are not yet restored).

Progress: recovered, last_checkpoint, results_unsynced (DELIVERY records appended
since the last sync_results()).
"""
import os
import time

from qmailpy.backends.log.commit import LOG_DIR


def now():
    """Epoch seconds, as records carry them."""
    return int(time.time())


class LogState:
    def __init__(self, queue, cleaner=None, log=None, segment_limit=None, runner_lags=()):
        self.queue = queue
        self.logdir = os.path.join(queue, LOG_DIR)
        self.cleaner = cleaner
        self.log = log
        self.segment_limit = segment_limit
        self.runner_lags = tuple(runner_lags)
        self.active = {}
        self.pending_new = {}
        self.set_aside = {}
        self.taken = {}
        self.locators = []
        self.replayed_state = {}
        self.lost_starts = {}
        self.live = {}
        self.garbage = set()
        self.to_clean = []
        self.replayed_clean = []
        self.removed_unsynced = set()
        self.new_cursor = None
        self.runners = []
        self.flusher = None
        self.flush_again = False
        self.state_counts = None
        self.problems = []
        self.reported = set()
        self.damage = []
        self.recovered = False
        self.last_checkpoint = 0
        self.results_unsynced = False

    def warn(self, text):
        if self.log is not None:
            self.log(b"warning: " + text.encode("utf-8", "surrogateescape") + b"\n")
