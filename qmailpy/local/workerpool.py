"""qmail-lspawn's delivery workers: one long-lived process per recipient account, reused.

Instead of forking a child per delivery, qmail-lspawn (qmailpy.spawn.serve with
a pool) finds the recipient itself (qmailpy.local.users: users/cdb, then the
passwd database, then the alias user, as qmail-getpw would) and hands the
delivery to an idle worker that already runs as that account, forking one
(no exec) when there is none. A worker switched to its account's uid and gid
once, in every uid slot, when it started, so isolation between users is still
process and uid isolation: a worker never serves another account. It serves one
delivery at a time, then waits for the next: at most MAX_USE deliveries in its
life, and it is retired after MAX_IDLE seconds without work or when more than
IDLE_CAP workers are idle (the one idle longest goes first).

A job is the delivery's fields (marshal) with two descriptors: the message,
which becomes fd 0, and the write end of the report pipe, which becomes fds 1
and 2, as for a forked delivery child. The worker runs qmail-local's code
(qmailpy.local.deliver), puts /dev/null back on fds 0-2 and reports the exit
status in one packet. A worker that dies in a delivery is reported as killed by
SIGKILL ("qmail-local crashed"), and only that delivery is lost. A bug in the
delivery (an exception qmail-local's code does not foresee) is a deferral whose
report says "internal error in qmail-local: TYPE: ..."; the traceback comes back
in the packet and qmail-lspawn writes it on its stderr, which is qmail-send's log. A |program
line is still its own process, spawned by the worker as the user.
"""
import marshal
import os
import signal

from qmailpy import internalerror, workers
from qmailpy.util.environ import replace as replace_environ
from qmailpy.local import users
from qmailpy.local import deliver as local_deliver

MAX_USE = 1000
MAX_IDLE = 60
IDLE_CAP = 16

QLX_USAGE = 112
OUT_OF_MEMORY = b"Out of memory. (#4.3.0)\n"
PROGRAM = "qmail-local"
TRACE_MAX = 16384           # of a bug's traceback (its end) in a worker's report
QLX_ROOT = 113


def _exited(code):
    return (code & 0xFF) << 8


class DeliveryWorkers(workers.Pool):
    def __init__(self, home, aliasempty, max_use=MAX_USE, max_idle=MAX_IDLE, idle_cap=IDLE_CAP):
        super().__init__(max_use, max_idle, idle_cap)
        self.home, self.aliasempty = home, aliasempty
        self.base_environ = dict(os.environb)
        self.root = os.geteuid() == 0
        # a home another account owns (docs/security.md "Single-user homes started as
        # root"): its users/assign is that account's, so it names no one else to become
        from qmailpy import privs
        self.owner = privs.home_owner(home) if self.root else None

    def start(self, cmd, messfd, out_w):
        """Hand the delivery to a worker (None), or the (wstat, output) of one that needs none.
        Both descriptors are this call's to close."""
        try:
            return self._start(cmd, messfd, out_w)
        finally:
            os.close(messfd)
            os.close(out_w)

    def _start(self, cmd, messfd, out_w):
        at = cmd.recipient.rfind(b"@")
        local, domain = cmd.recipient[:at], cmd.recipient[at + 1:]
        if not local:
            return _exited(0), b""                  # <@host>: the trash address
        try:
            found = users.lookup(self.home, local)
        except users.LookupFailure as e:
            return _exited(e.code), b""
        if found.uid == 0:
            return _exited(QLX_ROOT), b""
        if not self.root and found.uid != os.getuid():
            return _exited(111), (b"Unable to deliver as uid %d: qmail-lspawn runs as uid %d,"
                                  b" not root. (#4.3.0)\n" % (found.uid, os.getuid()))
        if self.owner is not None and ((found.uid, found.gid) != (self.owner.uid, self.owner.gid)
                                       or found.gid == 0):
            return _exited(111), (
                b"Unable to switch to uid %d gid %d: this home's %s/ belongs to %s (uid %d gid %d),"
                b" which may deliver only as itself. (#4.3.0)\n"
                % (found.uid, found.gid, self.owner.where.encode(),
                   os.fsencode(self.owner.name), self.owner.uid, self.owner.gid))
        key = (found.uid, found.gid)
        job = marshal.dumps((found.user, found.home, local, found.dash, found.ext, domain,
                             cmd.sender))
        home, aliasempty, environ = self.home, self.aliasempty, self.base_environ
        self.hand(key, lambda channel: _worker_main(channel, key, home, aliasempty, environ),
                  cmd.slot, job, [messfd, out_w])
        return None

    def results(self, slot, payload):
        # a worker that died in the delivery: WIFSIGNALED, "qmail-local crashed"
        if payload is None:
            return [(slot, signal.SIGKILL, None)]
        code, _, trace = payload.partition(b" ")
        if trace:               # a bug's traceback: to qmail-lspawn's stderr, qmail-send's log
            internalerror.write(2, trace)
        return [(slot, _exited(int(code)), None)]


# -- in a worker -----------------------------------------------------------------

def _worker_main(channel, key, home, aliasempty, base_environ):
    """Become the account, then deliver job after job until the spawner closes the channel."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    channel = workers.keep_only_channel(channel)
    uid, gid = key
    if os.geteuid() == 0:
        from qmailpy import privs
        try:
            privs.switch_to(uid, gid)
        except privs.PrivError:
            return _refuse_all(channel, QLX_USAGE)      # qmail: prot_gid/prot_uid failure
        if os.getuid() == 0:
            return _refuse_all(channel, QLX_ROOT)
    limits = _limits()
    installed = None                # the environment as the last delivery left it
    while True:
        job = workers.next_job(channel, 2)
        if job is None:
            return 0
        payload, fds = job
        installed = replace_environ(os.environb, base_environ, installed)
        code, trace = _deliver(home, aliasempty, marshal.loads(payload), fds, installed)
        report = b"%d" % code + (b" " + internalerror.tail(trace, TRACE_MAX) if trace else b"")
        # a program of this account's (prlimit --pid $PPID) lowered its limits: that must
        # not reach its next delivery, so this worker ends and a new one takes over
        ending = _limits() != limits
        try:
            (workers.send_last if ending else workers.send)(channel, report)
        except OSError:
            return 0
        if ending:
            return 0


_LIMITS = ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_AS", "RLIMIT_DATA",
           "RLIMIT_STACK", "RLIMIT_CPU", "RLIMIT_CORE")


def _limits():
    import resource
    return tuple(resource.getrlimit(getattr(resource, name)) for name in _LIMITS
                 if hasattr(resource, name))


def _refuse_all(channel, code):
    while True:
        packet = workers.receive(channel)
        if packet is None:
            return 0
        for fd in packet[1]:
            os.close(fd)
        try:
            workers.send(channel, b"%d" % code)
        except OSError:
            return 0


def _deliver(home, aliasempty, fields, fds, environ):
    """One delivery with the message on fd 0 and the report pipe on fds 1 and 2."""
    user, homedir, local, dash, ext, domain, sender = fields
    messfd, out_w = fds
    os.dup2(messfd, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.close(messfd)
    os.close(out_w)
    code, trace = 111, b""
    try:
        os.chdir(home)
    except OSError:
        workers.null_stdio()
        return QLX_USAGE, trace
    try:
        code = local_deliver.deliver(user, homedir, local, dash, ext, domain, sender,
                                     aliasempty, home=home, environ=environ)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 111
    except MemoryError:             # a condition, not a bug: qmail-local's temp_nomem
        _report(OUT_OF_MEMORY)
        code = 111
    except BaseException as e:       # a bug: named in the report, its traceback to the log
        trace = internalerror.trace(PROGRAM, e)
        _report(internalerror.summary(PROGRAM, e) + b" (#4.3.0)\n")
        code = 111
    finally:
        workers.null_stdio()
    return (code if isinstance(code, int) else 111), trace


def _report(text):
    try:
        os.write(2, text)
    except OSError:
        pass
