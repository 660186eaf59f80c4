"""Forwarding: the message goes back into the queue (docs/delivery.md "qmail-local").

One new message through qmail-queue (qmailpy.queue.client): DTLINE then the
message as read from msgfd (no Return-Path), envelope sender NEWSENDER,
recipients as written in the .qmail file. requeue() is that step alone, shared
with the forward and condredirect programs (docs/delivery.md "Delivery
helpers"), which word its failures their own way; forward() words them as
qmail-local does and returns the qp (the queueing process's pid).
"""
import os

from qmailpy.local.errors import Failure, error_str

_CHUNK = 65536


class ReadError(OSError):
    """The message could not be read; nothing was queued."""


def requeue(home, msgfd, dtline, sender, recipients):
    """Queue dtline + the rest of msgfd for sender and recipients: the queue's Result.
    Raises QueueStartError (no queueing child) or ReadError."""
    from qmailpy.queue.client import QueueClient
    qq = QueueClient(home)
    qq.write(dtline)
    while True:
        try:
            chunk = os.read(msgfd, _CHUNK)
        except OSError as e:
            qq.abort()
            raise ReadError(e.errno, e.strerror) from e
        if not chunk:
            return qq.finish(sender, recipients)
        qq.write(chunk)


def forward(home, msgfd, dtline, newsender, recipients):
    from qmailpy.queue.client import QueueStartError
    try:
        result = requeue(home, msgfd, dtline, newsender, recipients)
    except QueueStartError as e:
        raise Failure(111, b"Unable to fork: " + error_str(e) + b". (#4.3.0)") from e
    except ReadError as e:
        raise Failure(111, b"Unable to read message: " + error_str(e) + b". (#4.3.0)") from e
    if result.ok:
        return result.pid
    raise Failure(100 if result.permanent else 111,
                  b"Unable to forward message: " + result.text + b".")
