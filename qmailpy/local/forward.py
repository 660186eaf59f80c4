"""Forwarding: the message goes back into the queue (docs/delivery.md "qmail-local").

One new message through qmail-queue (qmailpy.queue.client): DTLINE then the
message as stored (no Return-Path), envelope sender NEWSENDER, recipients as
written in the .qmail file. Returns the qp (the queueing process's pid).
"""
import os

from qmailpy.local.errors import Failure, error_str

_CHUNK = 65536


def forward(home, msgfd, dtline, newsender, recipients):
    from qmailpy.queue.client import QueueClient, QueueStartError
    try:
        qq = QueueClient(home)
    except QueueStartError as e:
        raise Failure(111, b"Unable to fork: " + error_str(e) + b". (#4.3.0)") from e
    qq.write(dtline)
    while True:
        try:
            chunk = os.read(msgfd, _CHUNK)
        except OSError as e:
            qq.abort()
            raise Failure(111, b"Unable to read message: " + error_str(e) + b". (#4.3.0)") from e
        if not chunk:
            result = qq.finish(newsender, recipients)
            break
        qq.write(chunk)
    if result.ok:
        return result.pid
    raise Failure(100 if result.permanent else 111,
                  b"Unable to forward message: " + result.text + b".")
