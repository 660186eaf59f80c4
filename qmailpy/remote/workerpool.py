"""qmail-rspawn's delivery workers: one message to several recipients of a domain in one
SMTP transaction, on a connection kept open for the next message.

qmail-send gives qmail-rspawn one command per recipient. The commands that arrive
together for the same message, sender and recipient domain (qmail-send sends a
message's due recipients in one burst) become one job: one qmail-remote run with
up to RCPT_LIMIT recipients, one MAIL, one RCPT per recipient and one DATA, as
Postfix's smtp client does. Each recipient still gets its own reply, the one a
qmail-remote run for it alone would have given, byte for byte (smtp.alone).

Jobs go to delivery workers keyed by the recipient domain: processes forked from
qmail-rspawn once, running as qmailr like it, that run qmail-remote's code
(qmailpy.remote.deliver) and keep the connection of an accepted transaction
(qmailpy.remote.cache) for the next message to the same address. A worker serves
one job at a time; one that dies in a job fails each of its recipients with
"qmail-remote crashed" (a temporary failure), as a crashed qmail-remote does. A bug
in a job (an exception qmail-remote's code does not foresee) defers its recipients
with "internal error in qmail-remote: TYPE: ..."; its traceback comes back in the
worker's report and qmail-rspawn writes it on its stderr, which is qmail-send's log.
"""
import marshal
import os
import signal

from qmailpy import internalerror, workers
from qmailpy.remote.deliver import output, records_of
from qmailpy.remote.smtp import alone

MAX_USE = 1000
MAX_IDLE = 60
IDLE_CAP = 16
RCPT_LIMIT = 50             # Postfix's smtp_destination_recipient_limit

_CANNOT_START = 111 << 8    # as a qmail-remote that could not be run: "ZUnable to run qmail-remote."


class RemoteWorkers(workers.Pool):
    large_reports = True            # its workers are qmailr, as qmail-rspawn is
    def __init__(self, home, max_use=MAX_USE, max_idle=MAX_IDLE, idle_cap=IDLE_CAP):
        super().__init__(max_use, max_idle, idle_cap)
        self.home = home
        self.pending = []           # (cmd, messfd) until flush()

    def start(self, cmd, messfd, out_w):
        os.close(out_w)             # the records come back in the worker's packet
        self.pending.append((cmd, messfd))
        return None

    def flush(self):
        groups = {}                 # (messid, sender, domain, n) -> [domain, messfd, slots, rcpts]
        counts = {}
        for cmd, messfd in self.pending:
            domain = cmd.recipient[cmd.recipient.rfind(b"@") + 1:]
            base = (cmd.messid, cmd.sender, domain.lower())
            key = base + (counts.get(base, 0),)
            group = groups.get(key)
            if group is not None and len(group[2]) >= RCPT_LIMIT:
                counts[base] = counts.get(base, 0) + 1
                key = base + (counts[base],)
                group = None
            if group is None:
                groups[key] = [domain, messfd, [cmd.slot], [cmd.recipient], cmd.sender]
            else:
                os.close(messfd)    # the group's first descriptor reads the same file
                group[2].append(cmd.slot)
                group[3].append(cmd.recipient)
        self.pending = []
        failed = []
        home = self.home
        for (_, _, lowered, _), (domain, messfd, slots, recipients, sender) in groups.items():
            job = marshal.dumps((domain, sender, recipients))
            try:
                self.hand(lowered, lambda channel: _worker_main(channel, home), slots, job, [messfd])
            except OSError:
                failed += [(slot, _CANNOT_START, b"") for slot in slots]
            finally:
                os.close(messfd)
        return failed

    def results(self, slots, payload):
        if payload is None:         # WIFSIGNALED: "qmail-remote crashed"
            return [(slot, signal.SIGKILL, b"") for slot in slots]
        records, giving_up, bugs = marshal.loads(payload)
        for trace in bugs:          # a bug's traceback: to qmail-rspawn's stderr, qmail-send's log
            internalerror.write(2, trace)
        verdict, per_recipient = records[-1], records[:-1]
        return [(slot, 0, output(alone(per_recipient[i], verdict, giving_up)
                                 if i < len(per_recipient) else [verdict]))
                for i, slot in enumerate(slots)]


# -- in a worker -----------------------------------------------------------------

def _worker_main(channel, home):
    """Deliver job after job until qmail-rspawn closes the channel, keeping connections."""
    from qmailpy.remote.cache import Connections
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    channel = workers.keep_only_channel(channel)
    kept = Connections()
    try:
        while True:
            channel.settimeout(kept.wait())
            try:
                job = workers.next_job(channel, 1)
            except TimeoutError:
                kept.expire()
                continue
            if job is None:
                return 0
            payload, fds = job
            domain, sender, recipients = marshal.loads(payload)
            alone, bugs = [], []
            try:
                records = records_of([domain, sender] + recipients, home, fds[0], kept, alone,
                                     bugs)
            finally:
                os.close(fds[0])
            bugs = [internalerror.tail(trace, workers.MAX_PACKET // 4) for trace in bugs]
            try:
                workers.send_report(channel, marshal.dumps((records, alone[0] if alone else None,
                                                            bugs)))
            except OSError:
                return 0
    finally:
        kept.close()
