"""qmail-queue's side of the log backend: the ENVELOPE append (S2 -> S4).

qmail-queue writes the body to mess/ exactly as for the directory backend
(S1 -> S2: pid/ file, link to mess/S/n, Received line + fd 0, fsync; the steps
are qmailpy.mess, shared by both); then, instead of intd/ and todo/, it appends
one ENVELOPE record and returns only once the record is durable. Concurrent
qmail-queues share fsyncs (commit.py's group commit).

Imports stay small: this runs once per message.
"""
import os
import time

from qmailpy.backends.log.commit import LOG_DIR, LogWriter
from qmailpy.backends.log.records import encode_envelope
from qmailpy.mess import Failure, create_mess, fill_mess



def append_envelope(queue_dir, n, uid, qp, sender, recipients, now=None, writer=None):
    """Append message n's ENVELOPE and make it durable. Returns True if this call fsync'd."""
    record = encode_envelope(int(time.time()) if now is None else now, n, uid, qp, sender, recipients)
    own = writer is None
    if own:
        writer = LogWriter(os.path.join(queue_dir, LOG_DIR))
    try:
        seg, start = writer.append(record, durable=False)
        return writer.sync_to(seg, start + len(record))
    finally:
        if own:
            writer.close()


def write_body(queue_dir, message, received):
    """S1 -> S2 with qmail-queue's own steps (qmailpy.mess.create_mess and fill_mess):
    the new message's number n (its mess inode).

    For callers that queue from memory (tests, benchmarks, conversion); OSError
    names qmail-queue's exit code on failure."""
    fd = None
    try:
        fd, n, messdir, messfn = create_mess(queue_dir, os.getpid(), int(time.time()))
        fill_mess(fd, messdir, received + message, lambda: b"")
    except Failure as e:
        code = e.code
        if fd is not None:
            try:
                os.unlink(messfn)
            except OSError:
                pass
        raise OSError("unable to write the message into the queue (qmail-queue exit %d)" % code) from None
    finally:
        if fd is not None:
            os.close(fd)
    return n


def enqueue(queue_dir, message, sender, recipients, uid=None, writer=None, now=None):
    """Queue one message on a log-backend queue; its number once durable."""
    from qmailpy.envelope import date822
    uid = os.getuid() if uid is None else uid
    qp = os.getpid()
    received = b"Received: (qmail %d invoked by uid %d); %s\n" % (qp, uid, date822(now))
    n = write_body(queue_dir, message, received)
    append_envelope(queue_dir, n, uid, qp, sender, recipients, now=now, writer=writer)
    from qmailpy.trigger import pull
    pull(queue_dir)
    return n
