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
SIGKILL ("qmail-local crashed"), and only that delivery is lost. A |program
line is still its own process, spawned by the worker as the user.
"""
import marshal
import os
import selectors
import signal
import time

from qmailpy import workers
from qmailpy.local import users
from qmailpy.local import deliver as local_deliver

MAX_USE = 1000
MAX_IDLE = 60
IDLE_CAP = 16

QLX_USAGE = 112
QLX_ROOT = 113


def _exited(code):
    return (code & 0xFF) << 8


class DeliveryWorkers:
    def __init__(self, home, aliasempty, max_use=MAX_USE, max_idle=MAX_IDLE, idle_cap=IDLE_CAP):
        self.home, self.aliasempty = home, aliasempty
        self.max_use, self.max_idle, self.idle_cap = max_use, max_idle, idle_cap
        self.live = {}              # channel fd -> Worker
        self.idle = []              # idle workers, the one idle longest first
        self.selector = None
        self.base_environ = dict(os.environb)
        self.root = os.geteuid() == 0

    # -- the spawner's side ------------------------------------------------------
    def register(self, selector):
        self.selector = selector

    def start(self, cmd, messfd, out_w):
        """Hand the delivery to a worker (None), or the (wstat, output) of one that needs none."""
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
        key = (found.uid, found.gid)
        job = marshal.dumps((found.user, found.home, local, found.dash, found.ext, domain,
                             cmd.sender))
        worker = self._take_idle(key)
        if worker is not None:
            try:
                workers.send(worker.channel, job, [messfd, out_w])
            except OSError:                         # it died while idle
                self._drop(worker)
                worker = None
        if worker is None:
            worker = self._fork(key)
            workers.send(worker.channel, job, [messfd, out_w])
        worker.busy, worker.job = True, cmd.slot
        worker.uses += 1
        return None

    def readable(self, worker):
        """[(slot, wstat)] for the delivery the worker finished (or died in)."""
        try:
            packet = workers.receive(worker.channel)
        except OSError:
            packet = None
        done = []
        if worker.busy:
            if packet is None:
                wstat = signal.SIGKILL              # WIFSIGNALED: "qmail-local crashed"
            else:
                wstat = _exited(int(packet[0]))
            done.append((worker.job, wstat))
            worker.busy, worker.job = False, None
        if packet is None:
            self._drop(worker)
        elif worker.uses >= self.max_use:
            self._drop(worker)
        else:
            worker.idle_since = time.monotonic()
            self.idle.append(worker)
            while len(self.idle) > self.idle_cap:
                self._drop(self.idle[0])
        return done

    def timeout(self):
        if not self.idle:
            return None
        return max(0.0, self.idle[0].idle_since + self.max_idle - time.monotonic())

    def tick(self):
        now = time.monotonic()
        while self.idle and now - self.idle[0].idle_since >= self.max_idle:
            self._drop(self.idle[0])

    def close(self):
        for worker in list(self.live.values()):
            self._drop(worker)

    def _take_idle(self, key):
        for i in range(len(self.idle) - 1, -1, -1):     # the most recently used first
            if self.idle[i].key == key:
                return self.idle.pop(i)
        return None

    def _fork(self, key):
        worker = workers.fork(lambda channel: _worker_main(channel, key, self.home,
                                                           self.aliasempty, self.base_environ))
        worker.key = key
        self.live[worker.fileno()] = worker
        self.selector.register(worker.channel, selectors.EVENT_READ, ("pool", worker))
        return worker

    def _drop(self, worker):
        if worker in self.idle:
            self.idle.remove(worker)
        if self.live.pop(worker.fileno(), None) is not None:
            self.selector.unregister(worker.channel)
        worker.channel.close()


# -- in a worker -----------------------------------------------------------------

def _worker_main(channel, key, home, aliasempty, base_environ):
    """Become the account, then deliver job after job until the spawner closes the channel."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Only the channel stays open: the spawner's pipes and other workers' channels must
    # not leak into this one (a held write end would delay another delivery's EOF).
    if channel.fileno() != 3:
        os.dup2(channel.fileno(), 3)
        channel.detach()
    os.closerange(4, 65536)
    _null_stdio()           # not qmail-send's pipes: those are qmail-lspawn's alone
    import socket
    channel = socket.socket(fileno=3)
    uid, gid = key
    if os.geteuid() == 0:
        from qmailpy import privs
        try:
            privs.switch_to(uid, gid)
        except privs.PrivError:
            return _refuse_all(channel, QLX_USAGE)      # qmail: prot_gid/prot_uid failure
        if os.getuid() == 0:
            return _refuse_all(channel, QLX_ROOT)
    while True:
        packet = workers.receive(channel)
        if packet is None:
            return 0
        payload, fds = packet
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return 111
        code = _deliver(home, aliasempty, base_environ, marshal.loads(payload), fds)
        try:
            workers.send(channel, b"%d" % code)
        except OSError:
            return 0


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


def _deliver(home, aliasempty, base_environ, fields, fds):
    """One delivery with the message on fd 0 and the report pipe on fds 1 and 2."""
    user, homedir, local, dash, ext, domain, sender = fields
    messfd, out_w = fds
    os.dup2(messfd, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.close(messfd)
    os.close(out_w)
    os.environb.clear()
    os.environb.update(base_environ)
    code = 111
    try:
        os.chdir(home)
        code = local_deliver.deliver(user, homedir, local, dash, ext, domain, sender,
                                     aliasempty, home=home)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 111
    except OSError:
        code = QLX_USAGE
    except BaseException as e:       # a crash in delivery code must still produce a report
        try:
            os.write(2, ("qmail-spawn child failed: %s\n" % e).encode("utf-8", "replace"))
        except OSError:
            pass
        code = 111
    finally:
        _null_stdio()
    return code if isinstance(code, int) else 111


def _null_stdio():
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
