"""Long-lived worker processes: a job handed over a socket pair instead of a fork per job.

A server (qmail-smtpd-listen, qmail-qmqpd, qmail-lspawn) forks a worker once, with no exec,
so the worker starts with everything the server had loaded, and then hands it job
after job: one packet of a few bytes with at most MAX_FDS file descriptors
(SCM_RIGHTS: an accepted connection, a message file, a report pipe). The worker
answers each job with one packet when it is done
(send_report: a larger report in a memfd attached to a marker packet). A worker serves one job at a
time, so a crash loses only the job it was doing; the server sees its end of the
socket pair become readable with nothing in it (EOF) and counts that job as lost.
A worker that ends with an exception writes its traceback on fd 2 (qmailpy.internalerror):
the server's stderr, its log, unless the worker put /dev/null there.

The socket pair is SOCK_SEQPACKET: every packet arrives whole or not at all, and
the end of the other side reads as an empty packet. No packet of ours is empty.

A server retires a worker by closing its end: the worker reads EOF when it next
waits for a job and exits; a job already handed over is finished first. This is
how max_use (jobs per worker) and max_idle (seconds a worker may wait for work)
are enforced, by the server alone, so a job is never handed to a worker that has
decided to exit. A worker that decides to end by itself (qmail-lspawn's, when a program
lowered its resource limits) says so in its last report (send_last), before the server
could hand it another job.
"""
import os
import selectors
import socket
import stat
import sys
import time

MAX_FDS = 4
MAX_PACKET = 65536
REPORT_MAX = 16 << 20       # the largest report a pool with large_reports reads from a memfd
_LARGE = b"\0report in the descriptor"
_LAST = b"\0last report\0"          # before a report: the worker ends after it


class Worker:
    """The server's handle on one worker process."""
    __slots__ = ("pid", "channel", "key", "busy", "uses", "idle_since", "job")

    def __init__(self, pid, channel, key=None):
        self.pid = pid
        self.channel = channel      # the server's end of the socket pair
        self.key = key              # what the worker is for (qmail-lspawn: the recipient's uid)
        self.busy = False
        self.uses = 0
        self.idle_since = None
        self.job = None             # what the server remembers of the job in hand

    def fileno(self):
        return self.channel.fileno()


def fork(body, close_in_child=()):
    """Fork a worker running body(channel) -> exit status; the server's Worker.

    close_in_child: sockets and raw fds of the server the worker must not keep
    (listening sockets, other workers' channels). OSError when the fork fails."""
    server_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:
        server_end.close()
        worker_end.close()
        raise
    if pid == 0:
        code = 111
        try:
            server_end.close()
            for thing in close_in_child:
                try:
                    if isinstance(thing, int):
                        os.close(thing)
                    else:
                        thing.close()
                except OSError:
                    pass
            code = body(worker_end)
        except Exception as e:      # a bug: the traceback to the server's stderr, its log
            from qmailpy import internalerror
            internalerror.log(os.path.basename(sys.argv[0]) + " worker", e)
            code = 111
        except BaseException:
            code = 111
        finally:
            os._exit(code if isinstance(code, int) else 111)
    worker_end.close()
    return Worker(pid, server_end)


def send(channel, payload, fds=()):
    """One packet (payload must not be empty) with fds attached; OSError if the peer is gone."""
    if fds:
        socket.send_fds(channel, [payload], list(fds))
    else:
        channel.send(payload)


def send_last(channel, payload):
    """A worker's report on its job, and word that it ends after it: the server retires
    it on reading this, so no next job is handed to a worker that is gone."""
    send(channel, _LAST + payload)


def send_report(channel, payload):
    """A worker's report on its job: one packet, or, when it would not fit in one (many
    recipients refused with long replies), a marker packet carrying a memfd that holds
    it. Only a pool whose workers run as its own account takes the second form
    (Pool.large_reports): reading a descriptor another account chose could block."""
    if len(payload) < MAX_PACKET:
        send(channel, payload)
        return
    from qmailpy.fileio import write_all
    fd = os.memfd_create("qmailpy-report", os.MFD_CLOEXEC)
    try:
        write_all(fd, payload)
        send(channel, _LARGE, [fd])
    finally:
        os.close(fd)


def _large_report(fds):
    """The report in the one memfd of a marker packet, or None (then the job counts as
    crashed): anything but one regular file of at most REPORT_MAX bytes is refused."""
    try:
        if len(fds) != 1:
            return None
        size = os.fstat(fds[0]).st_size
        if not stat.S_ISREG(os.fstat(fds[0]).st_mode) or size > REPORT_MAX:
            return None
        chunks, offset = [], 0
        while offset < size:
            chunk = os.pread(fds[0], size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def receive(channel):
    """The next packet as (payload, fds), or None at EOF (the other side is gone).

    Blocking unless the channel is non-blocking (then BlockingIOError)."""
    while True:
        try:
            payload, fds, flags, _ = socket.recv_fds(channel, MAX_PACKET, MAX_FDS)
        except InterruptedError:
            continue
        except ConnectionResetError:
            return None
        if flags & socket.MSG_CTRUNC:          # more fds than we take: refuse the packet
            for fd in fds:
                os.close(fd)
            raise OSError("too many descriptors in one packet")
        if not payload and not fds:
            return None
        return payload, fds


def next_job(channel, fd_count):
    """In a worker: the next job as (payload, fds) with exactly fd_count descriptors, or
    None when the server is gone or sent something else (then the worker ends)."""
    packet = receive(channel)
    if packet is None:
        return None
    if len(packet[1]) != fd_count:
        for fd in packet[1]:
            os.close(fd)
        return None
    return packet


class IdleWorkers:
    """A server's idle workers, the one idle longest first: the most recently used is
    taken first (its pages are warm), the one idle longest retired first."""

    def __init__(self, max_idle, cap=None):
        self.max_idle, self.cap = max_idle, cap
        self.workers = []

    def __len__(self):
        return len(self.workers)

    def __contains__(self, worker):
        return worker in self.workers

    def add(self, worker):
        """Idle from now; the workers to retire because more than cap are idle."""
        worker.idle_since = time.monotonic()
        self.workers.append(worker)
        over = len(self.workers) - self.cap if self.cap is not None else 0
        return self.workers[:max(0, over)]

    def take(self, key=None, any_key=True):
        """The most recently used idle worker (of key, unless any_key), no longer idle; or None."""
        for i in range(len(self.workers) - 1, -1, -1):
            if any_key or self.workers[i].key == key:
                return self.workers.pop(i)
        return None

    def remove(self, worker):
        if worker in self.workers:
            self.workers.remove(worker)

    def timeout(self):
        """Seconds until the next worker has been idle max_idle; None when none is idle."""
        if not self.workers:
            return None
        return max(0.0, self.workers[0].idle_since + self.max_idle - time.monotonic())

    def expired(self):
        """The workers idle for max_idle or longer."""
        now = time.monotonic()
        return [w for w in self.workers if now - w.idle_since >= self.max_idle]


class Pool:
    """The spawner's side of a set of workers keyed by what they serve (qmail-lspawn: the
    recipient's account; qmail-rspawn: the recipient's domain), for qmailpy.spawn.serve.

    Subclasses start jobs (start(), flush()) and turn a worker's report into results
    (results()); the pool keeps the idle ones, reuses the most recently used of a key
    first, and retires a worker after max_use jobs, max_idle seconds without work, or
    when more than idle_cap are idle (the one idle longest first)."""

    large_reports = False           # workers may send a report too large for a packet (send_report)

    def __init__(self, max_use, max_idle, idle_cap):
        self.max_use = max_use
        self.live = {}              # channel fd -> Worker
        self.idle = IdleWorkers(max_idle, idle_cap)
        self.selector = None

    # -- for spawn.serve ----------------------------------------------------------
    def register(self, selector):
        self.selector = selector

    def flush(self):
        """After a batch of start() calls: hand over what start() kept back; the
        [(slot, wstat, output)] of deliveries that could not be handed over."""
        return []

    def readable(self, worker):
        """[(slot, wstat, output or None)] of the deliveries the worker finished (or died in);
        output None: the report pipe holds it."""
        try:
            packet = receive(worker.channel)
        except OSError:
            packet = None
        last = packet is not None and not packet[1] and packet[0].startswith(_LAST)
        if last:
            packet = (packet[0][len(_LAST):], [])
        if self.large_reports and worker.busy and packet is not None and packet[0] == _LARGE:
            report = _large_report(packet[1])
            packet = None if report is None else (report, [])
        if packet is not None and (packet[1] or not worker.busy):
            for fd in packet[1]:        # a worker reports its job, with no descriptors, once:
                os.close(fd)            # anything else ends it, as if it had died
            packet = None
        done = []
        if worker.busy:
            try:
                done = self.results(worker.job, None if packet is None else packet[0])
            except Exception:           # a report that does not parse: the job crashed
                done, packet = self.results(worker.job, None), None
            worker.busy, worker.job = False, None
        if packet is None or last or worker.uses >= self.max_use:
            self.drop(worker)
        else:
            for extra in self.idle.add(worker):
                self.drop(extra)
        return done

    def timeout(self):
        return self.idle.timeout()

    def tick(self):
        for worker in self.idle.expired():
            self.drop(worker)

    def close(self):
        for worker in list(self.live.values()):
            self.drop(worker)

    # -- for subclasses -------------------------------------------------------------
    def results(self, job, payload):
        """[(slot, wstat, output or None)] for a job; payload None: the worker died in it."""
        raise NotImplementedError

    def hand(self, key, body, job, payload, fds):
        """Send the job to an idle worker of key, or to a new one running body(channel)."""
        worker = self.idle.take(key, any_key=False)
        if worker is not None:
            try:
                send(worker.channel, payload, fds)
            except OSError:                         # it died while idle
                self.drop(worker)
                worker = None
        if worker is None:
            worker = fork(body)
            worker.key = key
            self.live[worker.fileno()] = worker
            self.selector.register(worker.channel, selectors.EVENT_READ, ("pool", worker))
            try:
                send(worker.channel, payload, fds)
            except OSError:
                self.drop(worker)
                raise
        worker.busy, worker.job = True, job
        worker.uses += 1

    def drop(self, worker):
        self.idle.remove(worker)
        if self.live.pop(worker.fileno(), None) is not None:
            self.selector.unregister(worker.channel)
        worker.channel.close()


def keep_only_channel(channel):
    """In a new worker of a spawner: the channel moved to fd 3, every other descriptor above
    2 closed (the spawner's pipes and other workers' channels must not leak into this one:
    a held write end would delay another delivery's EOF), /dev/null on fds 0-2 (not
    qmail-send's pipes: those are the spawner's alone). The channel as a new socket."""
    if channel.fileno() != 3:
        # close-on-exec: a |program the worker runs must not get the channel to its
        # spawner (qmail-lspawn is root and would take whatever it wrote for a report)
        os.dup2(channel.fileno(), 3, inheritable=False)
        channel.detach()
    os.closerange(4, 65536)
    null_stdio()
    return socket.socket(fileno=3)


def null_stdio():
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
