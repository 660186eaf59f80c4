"""The queue's messages one at a time, as snapshot message records (qmail-snapshot(5)),
for `qmailctl queue` subcommands: memory bounded however long the queue.

records(home) yields every message queued (S4, not yet preprocessed, channel "todo"
for its recipients, birth = when it was queued) or preprocessed (S5); messages still
being written (S2, S3) are not in the queue yet. Directory backend: mess/0..22, each
split in ascending number (qmail-qread's order), the other files of each number
looked up by name. Log backend: LogQueue.stream_states(), in log order. With
`numbers`, only those are looked up (directly on the directory backend). Each
record also has "held": kept back by `qmailctl queue hold` (hold/N on the
directory backend, the held bit of its snapshot on the log backend); its state is
then HELD, as in a snapshot; and "set_aside": why qmail-send sets it aside (a queued
message on the log backend whose PREPROCESSED record would not fit: the check of
backends/log/preprocess.py, with qmail-send's routing; docs/qmail-send.md "Messages set
aside"), else null.
"""
import os
import socket

from qmailpy import layout, snapshot_format as snapshot, states
from qmailpy.layout import CHANNELS, SPLIT


def records(home, numbers=None, host=None):
    from qmailpy.backends import backend_name
    host = host or socket.gethostname()
    if backend_name(home) == "dir":
        return _dir_records(host, layout.queue_dir(home), numbers)
    return _log_records(host, home, numbers)


# --- directory backend ------------------------------------------------------------

def _stat(queue, rel):
    try:
        return os.stat(os.path.join(queue, rel))
    except FileNotFoundError:
        return None


def _dir_record(host, queue, n):
    """The record of number n, or None when n is not queued (or not yet complete)."""
    files = {}
    for kind in states.FILES:
        rel = layout.relpath(kind, n)
        st = _stat(queue, rel)
        if st is not None:
            files[kind] = snapshot._meta(rel, n % SPLIT if kind in layout.SPLIT_DIRS else None, st)
    state = states.classify(files)
    if state not in (states.S4, states.S5, states.HELD):
        return None
    record = snapshot._dir_message(host, queue, n, files, [])
    record["held"] = _stat(queue, "hold/%d" % n) is not None
    record["set_aside"] = None                   # the directory backend has no record limit
    if state == states.S4:
        record["birth"] = files["todo"]["mtime"]
    return record


def _dir_records(host, queue, numbers):
    if numbers is not None:
        for n in sorted(numbers):
            record = _dir_record(host, queue, n)
            if record is not None:
                yield record
        return
    for s in range(SPLIT):
        for n in sorted(layout.numbers_in(os.path.join(queue, "mess", str(s)))):
            record = _dir_record(host, queue, n)
            if record is not None:
                yield record


# --- log backend ----------------------------------------------------------------------

def _log_records(host, home, numbers):
    from qmailpy.backends.log import records as R
    from qmailpy.backends.log.queue import LogQueue
    queue = LogQueue(home)
    aside = _SetAside(home)
    try:
        for rec, done, notes in queue.stream_states():
            if numbers is not None and rec.n not in numbers:
                continue
            yield _log_record(host, queue.queue, rec, done, notes, R, aside)
    finally:
        queue.close()


class _SetAside:
    """Why qmail-send sets a queued message aside, or None: the check its preprocessing
    makes (backends/log/preprocess.py), routed by qmail-send's control files, read once."""

    def __init__(self, home):
        self.home, self.route = home, None

    def __call__(self, env, size):
        from qmailpy.backends.base import SetAside
        from qmailpy.backends.log.preprocess import preprocessed
        if self.route is None:
            from qmailpy.home import ControlError
            from qmailpy.send.controls import read_rewriter
            try:
                self.route = read_rewriter(self.home).route
            except ControlError:        # qmail-send cannot start either: it sets nothing aside
                self.route = False
        if self.route is False:
            return None
        try:
            preprocessed(env, (0, 0), size, self.route, 0)
        except SetAside as e:
            return str(e)
        return None


def _log_record(host, queue, rec, done, notes, R, aside):
    text = snapshot.text
    if rec.type == R.ENVELOPE:
        st = _stat(queue, layout.relpath("mess", rec.n))
        record = snapshot.message_record(
            host, rec.n, "log", {}, text(rec.sender),
            [snapshot.recipient("todo", text(r), False) for r in rec.recipients],
            state=states.S4, birth=rec.time, size=st.st_size if st is not None else None)
        record["held"] = False
        record["set_aside"] = aside(rec, st.st_size if st is not None else 0)
        return record
    recipients = []
    for channel in CHANNELS:
        _, rcpts = rec.channels.get(channel, (0, []))
        for i, (was_done, address) in enumerate(rcpts):
            recipients.append(snapshot.recipient(channel, text(address),
                                                 was_done or (channel, i) in done))
    held = bool(rec.fields.get("held"))
    record = snapshot.message_record(host, rec.n, "log", {}, text(rec.sender), recipients,
                                     text(notes) if notes else None, bouncing=bool(notes),
                                     state=states.HELD if held else states.S5, birth=rec.birth,
                                     size=rec.size)
    record["held"] = held
    record["set_aside"] = None
    return record
