"""A live home's queue snapshot (qmail-snapshot(5)), for qmailctl snapshot and qmail-audit's
home inputs: the directory queue walked file by file (qmailpy.snapshot_format.walk_dir), the
log backend through its own reader. The format itself is qmailpy.snapshot_format."""
import os
import socket
import time

from qmailpy import layout
from qmailpy.backends import backend_name, open_backend
from qmailpy.home import control_int
from qmailpy.layout import CHANNELS
from qmailpy.snapshot_format import (header, mess_message_id, message_record, recipient, text,
                                     trailer, walk_dir)
from qmailpy.states import DEFAULT_QUEUELIFETIME


def walk_log(host, home):
    """Message records of a log-backend home, from the backend's own reader."""
    backend = open_backend(home)
    queue = layout.queue_dir(home)
    for view in backend.list_messages():
        recipients = [recipient(channel, *_view_record(rec))
                      for channel in CHANNELS for rec in getattr(view, channel)]
        problems = [view.error] if view.error else []
        mid = None
        try:
            mid = mess_message_id(queue, {"path": "mess/" + backend.message_path(view.n)})
        except OSError as e:
            problems.append("unreadable: message %d: %s" % (view.n, e))
        yield message_record(host, view.n, "log", {}, text(view.sender) if view.sender is not None
                             else None, recipients, bouncing=view.bouncing, problems=problems,
                             state=view.state, birth=view.birth, size=view.size, message_id=mid)


def _view_record(rec):
    """(address, done) of a MessageView recipient: a ChannelRecord or an (address, done) pair."""
    if hasattr(rec, "address"):
        address, done = rec.address, rec.done
    else:
        address, done = rec
    return (text(address) if isinstance(address, bytes) else address), done


def walk(home, host=None, now=None):
    """Every line (as a record dict) of a snapshot of one home: header, messages, trailer."""
    host = host or socket.gethostname()
    backend = backend_name(home)
    lifetime = control_int(home, "queuelifetime", DEFAULT_QUEUELIFETIME)
    yield header(host, os.path.abspath(home), backend, time.time() if now is None else now,
                 lifetime)
    count = 0
    messages = walk_dir(host, layout.queue_dir(home)) if backend == "dir" else walk_log(host, home)
    for record in messages:
        count += 1
        yield record
    yield trailer(host, count)
