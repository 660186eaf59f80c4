"""qmail-queue's side of the log backend: the ENVELOPE append (S2 -> S4).

qmail-queue writes the body to mess/ exactly as for the directory backend
(S1 -> S2: pid/ file, link to mess/S/n, Received line + fd 0, fsync); then, instead
of intd/ and todo/, it appends one ENVELOPE record and returns only once the record
is durable. Concurrent qmail-queues share fsyncs (logcommit's group commit).

Imports stay small: this runs once per message.
"""
import os
import time

from qmailpy.backends.logcommit import LOG_DIR, LogWriter
from qmailpy.backends.logrecords import encode_envelope
from qmailpy.layout import SPLIT



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
    """S1 -> S2 as qmail-queue does it: the new message's number n (its mess inode).

    For callers that queue from memory (tests, benchmarks, conversion)."""
    pid = os.getpid()
    start = int(time.time())
    for seq in range(1, 10):
        pidfn = os.path.join(queue_dir, "pid", "%d.%d.%d" % (pid, start, seq))
        try:
            fd = os.open(pidfn, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            continue
    else:
        raise OSError("unable to create a pid/ file")
    try:
        n = os.fstat(fd).st_ino
        messdir = os.path.join(queue_dir, "mess", str(n % SPLIT))
        os.link(pidfn, os.path.join(messdir, str(n)))
        os.unlink(pidfn)
        view = memoryview(received + message)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(messdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
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
