"""Helpers for the log-backend tests: a bare queue tree and a driver that plays qmail-send.

The driver calls the QueueBackend methods in qmail-send's order (docs/queue-format.md "Preprocessing (qmail-send + qmail-clean, S4→S5)"; docs/queue-format.md "Delivery and completion (S5→S1)",
docs/qmail-send.md "Scheduling and retries"): preprocess new work, open a pass per due channel (info + recipients),
"deliver" each pending recipient by appending a line to a deliveries file, mark it
done (or add a bounce note first for a failure), then finish or reschedule the
channel, and complete messages with no channel left.
"""
import os

from qmailpy.layout import SPLIT

LOCAL_DOMAIN = b"@test.example"


def make_queue(root):
    """A queue/ tree with the directories the log backend uses; returns the home."""
    home = os.path.join(str(root), "home")
    for d in ["pid", "lock", "intd", "todo", "bounce"]:
        os.makedirs(os.path.join(home, "queue", d), exist_ok=True)
    for kind in ("mess", "info", "local", "remote"):
        for s in range(SPLIT):
            os.makedirs(os.path.join(home, "queue", kind, str(s)), exist_ok=True)
    os.makedirs(os.path.join(home, "control"), exist_ok=True)
    return home


def route(addr):
    return ("local" if addr.endswith(LOCAL_DOMAIN) else "remote"), addr


def started(home):
    """A LogQueue as qmail-send holds it after startup, its new work preprocessed."""
    from qmailpy.backends.log.queue import LogQueue
    lq = LogQueue(home, runner_lags=(0,))
    lq.startup()
    for n in lq.new_work():
        lq.preprocess(n, route)
    return lq


def deliver_all(lq, deliveries_path, now=None, fail=(), defer=(), limit=1000):
    """Run passes until nothing is due: the number of passes made."""
    passes = 0
    for _ in range(limit):
        for n in lq.new_work():
            lq.preprocess(n, route)
        entries = list(lq.due(now))
        for n in list(lq.state.active):
            a = lq.state.active[n]
            for c in list(a.offered):
                if all((e.n, e.channel) != (n, c) for e in entries):
                    entries.append(_Entry(n, c))
        if not entries:
            return passes
        for e in entries:
            passes += 1
            if e.n not in lq.state.active:
                continue
            if e.channel is None:
                if lq.completion_due(e.n):
                    lq.bounce_notes(e.n) and lq.drop_bounce_notes(e.n)
                    lq.complete(e.n)
                continue
            if e.channel not in lq.state.active[e.n].channels:
                continue
            lq.info(e.n)
            left = False
            for rec in lq.recipients(e.n, e.channel):
                if rec.done:
                    continue
                if rec.address in defer:
                    left = True
                    continue
                with open(deliveries_path, "ab") as f:
                    f.write(b"%d %s\n" % (e.n, rec.address))
                if rec.address in fail:
                    lq.add_bounce_note(e.n, b"<%s>:\nfailed\n\n" % rec.address)
                lq.mark_done(e.n, e.channel, rec)
            if left:
                lq.reschedule(e.n, e.channel, 0 if now is None else now)
            else:
                lq.finish_channel(e.n, e.channel)
    raise AssertionError("driver did not finish")


class _Entry:
    def __init__(self, n, channel):
        self.n, self.channel = n, channel


def deliveries(path):
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    return [(int(a), b) for a, b in (line.split(b" ", 1) for line in lines)]
