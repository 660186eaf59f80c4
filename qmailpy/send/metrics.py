"""qmail-send's metrics, in the Prometheus text exposition format, as a file for
node_exporter's textfile collector: HOME/metrics/qmail.prom (docs/queue-operations.md
"Metrics").

Counters live here, one set per qmail-send process; whatever counts calls:

    from qmailpy.send import metrics
    metrics.delivery("remote", "deferral")    # result: success, deferral, failure
    metrics.throttled_wait("remote")          # a delivery held back by a throttle rule

qmail-send's loop calls MetricsFile.due() to learn when to write and write() to
write (every control/metricsinterval seconds, default 60, and at exit): the file is
replaced atomically (rename), so the collector never reads half of it. Counters
restart from 0 with qmail-send, as Prometheus counters may.

A file rather than an HTTP endpoint: qmail-send is a single-threaded select loop
with no listening socket, and a scrape must never wait on it or add an attack
surface to it; node_exporter already runs on hosts that are monitored, and the
file is readable by anyone debugging the host without Prometheus.
"""
import os

RESULTS = ("success", "deferral", "failure")
CHANNELS = ("local", "remote")
FILE = "qmail.prom"
DIRECTORY = "metrics"
INTERVAL_CONTROL = "metricsinterval"
DEFAULT_INTERVAL = 60
STATES = ("new", "preprocessed", "local", "remote", "held")


class Counters:
    def __init__(self):
        self.deliveries = {(c, r): 0 for c in CHANNELS for r in RESULTS}
        self.throttled = {c: 0 for c in CHANNELS}


COUNTERS = Counters()


def delivery(channel, result):
    COUNTERS.deliveries[(channel, result)] = COUNTERS.deliveries.get((channel, result), 0) + 1


def throttled_wait(channel):
    COUNTERS.throttled[channel] = COUNTERS.throttled.get(channel, 0) + 1


def render(counters, sizes, oldest_age, now):
    """The exposition text: sizes {state: count, "total": n} (None: not known, left
    out), oldest_age seconds or None."""
    out = []
    if sizes is not None:
        out += ["# HELP qmail_queue_messages Messages in the queue (queued or preprocessed).",
                "# TYPE qmail_queue_messages gauge",
                "qmail_queue_messages %d" % sizes["total"],
                "# HELP qmail_queue_messages_by_state Messages in the queue per state "
                "(local, remote: with that channel open).",
                "# TYPE qmail_queue_messages_by_state gauge"]
        out += ['qmail_queue_messages_by_state{state="%s"} %d' % (s, sizes.get(s, 0))
                for s in STATES]
    out += ["# HELP qmail_deliveries_total Delivery attempts by channel and result.",
            "# TYPE qmail_deliveries_total counter"]
    out += ['qmail_deliveries_total{channel="%s",result="%s"} %d' % (c, r, counters.deliveries[(c, r)])
            for c in CHANNELS for r in RESULTS]
    out += ["# HELP qmail_throttled_waits_total Deliveries held back by a throttle rule.",
            "# TYPE qmail_throttled_waits_total counter"]
    out += ['qmail_throttled_waits_total{channel="%s"} %d' % (c, counters.throttled.get(c, 0))
            for c in CHANNELS]
    out += ["# HELP qmail_queue_oldest_message_age_seconds Age of the oldest message body in the queue.",
            "# TYPE qmail_queue_oldest_message_age_seconds gauge",
            "qmail_queue_oldest_message_age_seconds %d" % (oldest_age or 0),
            "# HELP qmail_metrics_written_timestamp_seconds When qmail-send wrote this file.",
            "# TYPE qmail_metrics_written_timestamp_seconds gauge",
            "qmail_metrics_written_timestamp_seconds %d" % now]
    return "\n".join(out) + "\n"


def parse(text):
    """{'name{labels}': value} of exposition text (for tests and for reading it back)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


class OldestBody:
    """The oldest mess/ file's mtime, one split directory walked per refresh, so a
    refresh costs 1/23 of a walk; a message gone keeps its split's minimum until that
    split is walked again (at most 23 refreshes)."""

    def __init__(self, queue):
        from qmailpy.layout import SPLIT
        self.queue = queue
        self.minima = [None] * SPLIT
        self.next = 0
        self.walked = False

    def refresh(self):
        from qmailpy.layout import SPLIT, is_number
        splits = range(SPLIT) if not self.walked else (self.next,)
        for s in splits:
            oldest = None
            try:
                with os.scandir(os.path.join(self.queue, "mess", str(s))) as entries:
                    for entry in entries:
                        if is_number(entry.name):
                            try:
                                mtime = entry.stat(follow_symlinks=False).st_mtime
                            except FileNotFoundError:
                                continue
                            oldest = mtime if oldest is None or mtime < oldest else oldest
            except OSError:
                pass
            self.minima[s] = oldest
        self.next = (self.next + 1) % SPLIT if self.walked else 0
        self.walked = True
        known = [m for m in self.minima if m is not None]
        return min(known) if known else None


def queue_sizes(backend, queue):
    """{state: count, "total": n} of qmail-send's queue, or None while unknown: the log
    backend's own counters (backends/log/counts.py), the directory backend's counts."""
    if backend.name == "log":
        counts = backend.state.state_counts
        return counts.as_dict() if counts is not None else None
    from qmailpy.backends.dir.listing import state_counts
    return state_counts(queue)


class MetricsFile:
    """HOME/metrics/qmail.prom, written by qmail-send every interval seconds and at exit."""

    @classmethod
    def of(cls, home):
        from qmailpy.home import control_int
        return cls(home, control_int(home, INTERVAL_CONTROL, DEFAULT_INTERVAL))

    def __init__(self, home, interval):
        self.path = os.path.join(home, DIRECTORY, FILE)
        self.interval = max(1, interval)
        self.oldest = OldestBody(os.path.join(home, "queue"))
        self.next_write = 0
        self.failing = False

    def due(self):
        return self.next_write

    def write(self, sizes, now, counters=None):
        """Write the file; returns an error text the first time writing fails, else None."""
        self.next_write = now + self.interval
        oldest = self.oldest.refresh()
        text = render(counters or COUNTERS, sizes, None if oldest is None else max(0, now - oldest), now)
        tmp = "%s.tmp" % self.path
        try:
            os.makedirs(os.path.dirname(self.path), 0o755, exist_ok=True)
            with open(tmp, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.rename(tmp, self.path)
        except OSError as e:
            first, self.failing = not self.failing, True
            return "unable to write %s: %s" % (self.path, e.strerror) if first else None
        self.failing = False
        return None
