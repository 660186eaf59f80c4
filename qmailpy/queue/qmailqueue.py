"""qmail-queue: one message from fd 0 and its envelope from fd 1 into the queue (S1 -> S4).

The sequence is qmail's (docs/queue-format.md "qmail-queue (S1→S4)"; docs/queue-format.md "File formats"; docs/protocols.md "qmail-queue interface"), byte for byte and step for step:

  alarm 86400 s -> pid/{pid}.{start}.{seq} (O_EXCL, seq 1..9) -> link to mess/S/n
  -> unlink the pid name (S2) -> Received line + fd 0 -> fsync -> intd/n (O_EXCL, S3)
  -> u, p and the envelope records while reading fd 1 -> fsync -> link todo/n (S4)
  -> pull the trigger -> exit 0

plus the "syncdir" promise qmail lacks on Linux: the directories whose entries
the state machine relies on are fsync'd, so that exit 0 means the message
survives a power cut (see _sync_dir).

The steps up to S2 (pid/ file to an fsync'd mess/S/n) are qmailpy.mess, which
the log backend's in-memory enqueue uses too; this module adds the alarm and
signals, the accounts, the queue lock, intd/todo or the ENVELOPE, and the trigger.

run() returns the exit code instead of exiting, so an injector can run it in a
forked child (qmailpy.queue.client) without starting a new interpreter.

Privileges: qmail-queue is setuid qmailq in qmail. A Python program cannot be
setuid, so when started as root run() switches to the home's qmailq account
(qmailpy.privs.become) after recording the caller's real uid for the Received
line and the u record; started as any other user it runs as that user. Only
root and the queue's owner call it so (home.has_queue_rights): every other
submitter hands its message to qmail-qmqpd (qmailpy.queue.client), whose queueing
worker, running as qmailq, calls run_from() with the uid the kernel reported.
"""
import fcntl
import os
import time

try:
    import _signal as signal      # the C module: `signal` would import enum (~5 ms per message)
except ImportError:               # pragma: no cover - other interpreters
    import signal

from qmailpy.envelope import MAX_ADDRESS, date822
from qmailpy.fileio import write_all
from qmailpy.layout import SPLIT
from qmailpy.fileio import fsync_dir as _sync_dir   # see there: exit 0 must survive a power cut
# S1 -> S2 (pid/ file, mess/S/n, Received line + body, fsyncs) is shared with the log
# backend's enqueue; its Failure is this program's exit, whichever step raises it.
from qmailpy.mess import CHUNK as _CHUNK, Failure as _Exit, create_mess, fill_mess, hold_of, not_before_of

DEATH = 86400                     # qmail-queue's self-timer (seconds)
EXIT_TOO_MANY_RECIPIENTS = 12     # beyond control/maxrcpt or the queue's envelope bound (qmailpy.queuelimits)
TODO_SLOT = 0                     # qmailpy.groupsync slots: todo/, then mess/0 .. mess/SPLIT-1
SYNC_SLOTS = 1 + SPLIT

# Signals qmail-queue ignores; SIGALRM ends it with 52 (no cleanup).
_IGNORED = ("SIGPIPE", "SIGINT", "SIGQUIT", "SIGHUP", "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ")
# Crash signals sent from outside: exit 81 ("qq internal bug"), as qmail's sig_bugcatch.
# SIGSEGV, SIGBUS, SIGILL and SIGFPE keep their default action: a Python-level
# handler runs later, between bytecodes, so a real fault would simply recur
# forever; the process dies instead and the caller reports "qq crashed".
_BUGS = ("SIGABRT", "SIGSYS", "SIGTRAP")


def _alarm(signum, frame):
    os._exit(52)


def _bug(signum, frame):
    os._exit(81)


def received_who(uid, role_uids):
    """'by alias', 'from network', 'for bounce' or 'by uid N' (docs/queue-format.md "mess/S/n")."""
    if uid == role_uids.get("alias"):
        return b"by alias"
    if uid == role_uids.get("qmaild"):
        return b"from network"
    if uid == role_uids.get("qmails"):
        return b"for bounce"
    return b"by uid %d" % uid


def received_line(pid, who, start):
    return b"Received: (qmail %d invoked %s); %s\n" % (pid, who, date822(start))



def _setup_signals():
    # A forked injector may have signals blocked; the alarm must be able to fire.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for name in _IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    for name in _BUGS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _bug)
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.alarm(DEATH)


def setup_resident():
    """In a long-lived process running qmail-queue's code for one request after another
    (qmail-qmqpd's workers): qmail-queue's ignored signals, once. Its 24-hour alarm is
    not armed: the server bounds each request with its own deadline."""
    for name in _IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def prepare(home):
    """Load what run() needs and resolve the home's accounts, in a long-lived caller.

    QueueClient calls this before forking, so each forked queueing child starts
    with its modules imported and its account lookups cached instead of paying
    for both per message. Failures are left for run() to report.
    """
    from qmailpy import backends, privs, trigger  # noqa: F401
    try:
        roles = privs.load_roles(home)
        privs.role_uids(home, ("alias", "qmaild", "qmails", "qmailq"), roles)
        privs.group_id(home, "qmail", roles)
    except (OSError, privs.PrivError):
        pass
    try:
        if backends.backend_name(home) == "log":
            from qmailpy.backends.log import enqueue  # noqa: F401  (its record coding, crc32c)
    except (OSError, ValueError):
        pass


def run(home, msg_fd=0, env_fd=1):
    """Queue one message; the exit code of qmail-queue (docs/protocols.md "qmail-queue interface").

    $QMAILNOTBEFORE (epoch seconds) holds its delivery until then; a value that is not
    decimal digits exits 55 before anything is queued. $QMAILHOLD=1 queues it on hold
    (docs/queue-format.md "Hold at queueing"); any other value exits 55 too."""
    try:
        not_before = not_before_of(os.environ)
        hold = hold_of(os.environ)
    except ValueError:
        return 55
    return run_from(home, lambda: os.read(msg_fd, _CHUNK), lambda: os.read(env_fd, _CHUNK),
                    not_before=not_before, hold=hold)


def run_from(home, read_message, read_envelope, uid=None, tidy=False, not_before=None,
             resident=False, syncs=None, hold=False):
    """run() with the message and the envelope from two read functions.

    Each returns the next bytes (b"" at the end) or raises OSError. uid is the
    caller the message is queued for (default: this process's real uid);
    qmail-qmqpd passes the uid the kernel reported for its client. With tidy,
    every failure after the message file was made removes it (qmail-queue
    itself leaves S2/S3 files to the 36-hour cleanups on some failures).
    not_before (epoch seconds) becomes the mess file's mtime; hold sets its hold bit
    (qmailpy.mess.HOLD_MODE), which qmail-send turns into a hold. resident: the caller
    lives on after this message (setup_resident() was called once), so this
    process's signal handling is left as it is. syncs: a qmailpy.groupsync.DirSyncs
    shared with the other queueing workers, for the directory fsyncs.
    """
    queue = _Queue(home, read_message, read_envelope, uid, not_before, resident, syncs, hold)
    try:
        return queue.run()
    except _Exit as e:
        if tidy:
            queue.cleanup()
        return e.code
    except MemoryError:
        return 51
    except Exception as e:                # a bug of ours: qmail's "qq internal bug"
        from qmailpy import internalerror
        internalerror.log("qmail-queue", e)     # the traceback on stderr (docs/delivery.md)
        return 81
    finally:
        queue.release_queue()
        queue.close_files()         # a queueing worker lives on: no fd (or inode) per request


class _Queue:
    def __init__(self, home, read_message, read_envelope, uid=None, not_before=None,
                 resident=False, syncs=None, hold=False):
        self.home, self.read_message, self.read_envelope = home, read_message, read_envelope
        self.uid, self.not_before, self.resident, self.hold = uid, not_before, resident, hold
        self.syncs = syncs
        self.mess_fd = self.intd_fd = None
        self.messfn = self.intdfn = None
        self.queue_fd = None

    def die(self, code):
        raise _Exit(code)

    def cleanup(self):
        """After a read or write error: truncate and unlink what we made (intd first)."""
        for fd, name in ((self.intd_fd, self.intdfn), (self.mess_fd, self.messfn)):
            if name is None:
                continue
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            try:
                os.unlink(name)
            except OSError:
                return

    def die_read(self):
        self.cleanup()
        self.die(54)

    def die_write(self):
        self.cleanup()
        self.die(53)

    def run(self):
        if not self.resident:
            _setup_signals()              # the alarm is armed before any file is touched
        os.umask(0o033)
        pid = os.getpid()
        uid = os.getuid() if self.uid is None else self.uid
        start = int(time.time())
        try:
            from qmailpy import privs
            roles = privs.load_roles(self.home)
            role_uids = privs.role_uids(self.home, ("alias", "qmaild", "qmails"), roles)
            privs.become(self.home, "qmailq", roles)
        except (OSError, privs.PrivError):
            self.die(61)
        try:
            os.chdir(self.home)
        except OSError:
            self.die(61)
        try:
            from qmailpy.home import ControlError
            from qmailpy.queuelimits import EnvelopeBudget, read_maxrcpt
            self.budget = EnvelopeBudget(read_maxrcpt("."))
        except (ControlError, OSError):
            self.die(55)
        try:
            os.chdir("queue")
        except OSError:
            self.die(62)
        self.hold_queue()
        try:
            from qmailpy.backends import backend_name
            log_backend = backend_name(self.home) == "log"
        except (ValueError, OSError):
            self.die(55)
        received = received_line(pid, received_who(uid, role_uids), start)

        # S1 -> S2: a fresh inode under pid/, linked into mess/ under its number.
        self.mess_fd, n, messdir, self.messfn = create_mess(".", pid, start)
        intdfn, todofn = "intd/%d" % n, "todo/%d" % n
        # The message: Received line, then fd 0 verbatim.
        try:
            fill_mess(self.mess_fd, messdir, received, self.read_message, self.not_before,
                      self.sync_dir(1 + n % SPLIT), self.hold)
        except _Exit:
            self.cleanup()
            raise

        if log_backend:
            return self.log_envelope(n, uid, pid)

        # S2 -> S3: the envelope, streamed from fd 1 into intd/n.
        try:
            self.intd_fd = os.open(intdfn, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            self.die(65)
        self.intdfn = intdfn
        self.copy_envelope(b"u%d\0p%d\0" % (uid, pid))
        try:
            os.fsync(self.intd_fd)
        except OSError:
            self.die_write()

        # S3 -> S4: queued once todo/n is durable.
        try:
            os.link(intdfn, todofn)
        except OSError:
            self.die(66)
        try:
            self.sync_dir(TODO_SLOT)("todo")
        except OSError:
            # Not durable: take it back rather than promise what a power cut could undo.
            try:
                os.unlink(todofn)
            except OSError:
                pass
            self.die(66)
        from qmailpy.trigger import pull
        pull(".")
        return 0

    def sync_dir(self, slot):
        """fsync of a directory: shared through self.syncs in a queueing worker."""
        if self.syncs is None:
            return _sync_dir
        return lambda path: self.syncs.sync(slot, path)

    def hold_queue(self):
        """A shared flock on the queue directory until we return: `qmailctl convert` takes it
        exclusively, so a conversion waits for us and we wait for it; the backend is
        read only once we hold it."""
        try:
            self.queue_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self.queue_fd, fcntl.LOCK_SH)
        except OSError:
            self.die(62)

    def close_files(self):
        for fd in (self.intd_fd, self.mess_fd):
            if fd is not None:
                os.close(fd)
        self.intd_fd = self.mess_fd = None

    def release_queue(self):
        if self.queue_fd is not None:
            os.close(self.queue_fd)
            self.queue_fd = None

    def copy_envelope(self, out):
        """Read F sender NUL (T rcpt NUL)* NUL from fd 1, writing records to intd as they arrive."""
        out = bytearray(out)
        expect_sender = True
        in_address = in_sender = False
        length = 0
        while True:
            try:
                chunk = self.read_envelope()
            except OSError:
                self.die_read()
            if not chunk:
                self.die_read()
            pos, end = 0, len(chunk)
            while pos < end:
                if not in_address:
                    ch = chunk[pos]
                    if expect_sender:
                        if ch != 70:                    # 'F'
                            self.die(91)
                        expect_sender, in_sender = False, True
                    elif ch == 0:                       # the final NUL: not stored
                        self.flush_intd(out)
                        return
                    elif ch != 84:                      # 'T'
                        self.die(91)
                    out.append(ch)
                    pos += 1
                    in_address, length = True, 0
                    continue
                nul = chunk.find(b"\0", pos)
                stop = end if nul < 0 else nul
                length += stop - pos
                if length > MAX_ADDRESS:
                    self.die(11)
                out += chunk[pos:stop]
                if nul < 0:
                    pos = end
                else:
                    if not in_sender and not self.budget.admit(length):
                        # refused whole: nothing of it stays queued (no todo/, no ENVELOPE)
                        self.cleanup()
                        self.die(EXIT_TOO_MANY_RECIPIENTS)
                    out.append(0)
                    pos = nul + 1
                    in_address = in_sender = False
            if len(out) >= _CHUNK:
                self.flush_intd(out)

    def log_envelope(self, n, uid, pid):
        """Log backend, S2 -> S4: one ENVELOPE record, durable (group commit) before exit 0."""
        from qmailpy.backends.log.enqueue import append_envelope
        from qmailpy.envelope import parse_todo
        from qmailpy.trigger import pull
        self.env_buf = bytearray()
        self.copy_envelope(b"u%d\0p%d\0" % (uid, pid))
        todo = parse_todo(bytes(self.env_buf))
        try:
            append_envelope(".", n, uid, pid, todo.sender, todo.recipients)
        except OSError:
            self.die_write()
        pull(".")
        return 0

    def flush_intd(self, out):
        if self.intd_fd is None:              # log backend: the envelope is collected
            self.env_buf += out
            out.clear()
            return
        try:
            write_all(self.intd_fd, out)
        except OSError:
            self.die_write()
        out.clear()
