"""The accept loop shared by qmail-smtpd-listen and qmail-qmqpd: connections handed to workers.

The server accepts on its listening sockets and hands each connection to an idle
worker (qmailpy.workers), forking a new one only when none is idle and fewer than
`limit` exist, as Postfix's master does for smtpd. A worker serves one connection
at a time and many in its life: at most `max_use`, and it is retired after
`max_idle` seconds without work. So a connection costs a descriptor passed over a
socket pair, not a fork, and a crash still loses only the one connection the
worker was serving.

At most `limit` connections are served at once; further ones wait in the kernel's
backlog (the listening sockets are not even watched then). admit() runs in the
server before a connection is handed over, so a refused client costs no worker.
SIGTERM or SIGINT closes the listening sockets and every worker's channel and ends
the loop; a worker finishes the connection in hand, then reads EOF and exits.

One client (client_of() of a connection's context: an address, a uid) may have at
most `per_client` connections in workers at once, so one client cannot take every
worker, and all counted clients together at most `limit - reserved`: the `reserved`
workers are for connections that count against no client (client_of() None: the
queue server's qmaild and qmails), which so always find a worker however many
connections the others hold open. Beyond its share a connection waits in the
server, in order, for a worker it may take (at most `wait_per_client` of them per
client, `wait_limit` in all), and one beyond those is answered by too_many() and
closed. With wait_per_client 0 a connection beyond per_client is answered at once.
Those in line go first: a slot that frees goes to the oldest waiting connection that
may take it, before any connection accepted since (a client that reconnects at once
does not overtake one that waits).

Hooks for subclasses: admit(), client_of() and too_many() run in the server;
worker_started() runs once in each new worker, child() once per connection and
let_go() after it, once the server has been told the connection ended.
"""
import collections
import errno
import gc
import marshal
import os
import selectors
import signal

from qmailpy import workers

REFUSED = object()          # admit(): close the connection unanswered

DEFAULT_MAX_USE = 100       # connections per worker (Postfix's max_use)
DEFAULT_MAX_IDLE = 100      # seconds a worker may wait for a connection (Postfix's max_idle)

# accept() errors that mean "nothing to take now", not a broken socket
_TRANSIENT = (errno.EAGAIN, errno.ECONNABORTED, errno.EINTR, errno.EMFILE, errno.ENFILE,
              errno.ENOBUFS, errno.ENOMEM)


def half(limit):
    """The default per-client share: half the workers, rounded up (Postfix's per-client
    default is half its process limit)."""
    return (limit + 1) // 2


def default_reserved(limit):
    """Workers kept for connections that count against no client: a quarter, at least one
    (none when there is only one)."""
    return max(1, limit // 4) if limit > 1 else 0


class WorkerServer:
    def __init__(self, listening, limit, max_use=DEFAULT_MAX_USE, max_idle=DEFAULT_MAX_IDLE,
                 per_client=None, wait_per_client=0, wait_limit=0, reserved=0):
        self.listening = list(listening)
        for sock in self.listening:
            sock.setblocking(False)
        self.limit = limit
        self.max_use = max_use
        self.max_idle = max_idle
        if not 0 <= reserved < limit:
            raise ValueError("reserved workers must be fewer than the limit")
        self.shared = limit - reserved      # workers that counted clients may hold in all
        self.per_client = half(self.shared) if per_client is None else per_client
        self.wait_per_client, self.wait_limit = wait_per_client, wait_limit
        self.pool = {}              # channel fd -> Worker, every worker that may take work
        self.idle = workers.IdleWorkers(max_idle)
        self.active = {}            # client -> connections in workers
        self.counted = 0            # connections in workers that count against a client
        self.waiting = collections.deque()      # (sock_index, conn, context), oldest first
        self.waiting_of = {}        # client -> connections waiting
        self._stop = False
        self._wake = None
        self._selector = None
        self._watching = False

    # -- for subclasses ------------------------------------------------------
    def admit(self, sock, conn, remote):
        """In the server: a context for child() (marshal-able), or REFUSED."""
        return None

    def worker_started(self):
        """In a new worker, once, before its first connection."""

    def child(self, sock_index, conn, context):
        """In a worker, with conn blocking: the connection's exit status.

        sock_index: which of the listening sockets accepted it. Raising ends the worker."""
        raise NotImplementedError

    def let_go(self):
        """In a worker, after child() and its report: close what still holds the connection."""

    def client_of(self, context):
        """In the server: whom a connection counts against, or None (not counted)."""
        return None

    def too_many(self, conn, context):
        """In the server: answer a connection of a client over its share, before it is closed."""

    # -- the loop --------------------------------------------------------------
    def _on_term(self, signum, frame):
        self._stop = True

    def serve(self, ready=None):
        """Accept until SIGTERM/SIGINT; ready() runs once the signal handlers are set."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self._wake = (wake_r, wake_w)
        handled = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)
        old = {s: signal.getsignal(s) for s in handled}
        old_wakeup = signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        # Workers are reaped when SIGCHLD wakes the loop: a mask inherited from whoever
        # started us must not hold it back (zombies would pile up).
        old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)
        self._selector = selectors.DefaultSelector()
        self._selector.register(wake_r, selectors.EVENT_READ, None)
        gc.freeze()              # objects that exist now are never collected in a worker
        try:
            if ready is not None:
                ready()
            while not self._stop:
                self._watch(bool(self.idle) or len(self.pool) < self.limit)
                try:
                    events = self._selector.select(self.idle.timeout())
                except InterruptedError:
                    continue
                # Workers' reports first: a connection just ended frees its slot (and its
                # client's count) before the next one is accepted.
                if len(events) > 1:
                    events.sort(key=lambda event: not isinstance(event[0].data, workers.Worker))
                for key, _ in events:
                    if key.data is None:        # a signal: SIGCHLD (reap), SIGTERM, SIGINT
                        _drain(wake_r)
                        self._reap()
                    elif isinstance(key.data, workers.Worker):
                        if key.data.fileno() in self.pool:
                            self._from_worker(key.data)
                    else:
                        sock_index = key.data - 1
                        self._start_waiting()   # those in line before those just come
                        while (not self._stop and (self.idle or len(self.pool) < self.limit)
                               and self._accept(sock_index)):
                            pass
                self._start_waiting()
                for worker in self.idle.expired():
                    self._retire(worker)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in old.items():
                signal.signal(s, handler)
            for sock in self.listening:
                sock.close()
            for _, conn, _ in self.waiting:
                conn.close()
            for worker in list(self.pool.values()):
                self._retire(worker)
            self._selector.close()
            os.close(wake_r)
            os.close(wake_w)
        return 0

    def settle(self):
        """Take in every report workers have already sent (for admit(), before it refuses a
        client for connections that may have just ended)."""
        while True:
            ready = [key.data for key, _ in self._selector.select(0)
                     if isinstance(key.data, workers.Worker)]
            if not ready:
                return
            for worker in ready:
                if worker.fileno() in self.pool:
                    self._from_worker(worker)

    def _watch(self, wanted):
        """Watch the listening sockets only while a connection could be served."""
        if wanted == self._watching:
            return
        for index, sock in enumerate(self.listening):
            if wanted:
                self._selector.register(sock, selectors.EVENT_READ, index + 1)
            else:
                self._selector.unregister(sock)
        self._watching = wanted

    def _reap(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _accept(self, sock_index):
        """Accept one connection and hand it over; False when none was waiting."""
        try:
            conn, remote = self.listening[sock_index].accept()
        except OSError as e:
            if e.errno in _TRANSIENT:
                return False
            raise
        try:
            context = self.admit(self.listening[sock_index], conn, remote)
        except BaseException:
            conn.close()
            raise
        if context is REFUSED:
            conn.close()
            return True
        client = self.client_of(context)
        if client is not None and self._over_share(client):
            self.settle()                   # connections that ended while we were busy
            self._start_waiting()           # whose slots go to those in line first
            if self._over_share(client):
                self._wait(sock_index, conn, context, client)
                return True
        self._dispatch(sock_index, conn, context)
        return True

    def _over_share(self, client):
        return self.active.get(client, 0) >= self.per_client or self.counted >= self.shared

    def _wait(self, sock_index, conn, context, client):
        """A connection of a client over its share: in line, or answered and closed."""
        if self.waiting_of.get(client, 0) >= self.wait_per_client or len(self.waiting) >= self.wait_limit:
            try:
                self.too_many(conn, context)
            finally:
                conn.close()
            return
        self.waiting.append((sock_index, conn, context))
        self.waiting_of[client] = self.waiting_of.get(client, 0) + 1

    def _start_waiting(self):
        """Hand over, in order, the waiting connections whose client is under its share again."""
        for entry in list(self.waiting):
            if self._stop or not (self.idle or len(self.pool) < self.limit):
                return
            sock_index, conn, context = entry
            client = self.client_of(context)
            if not self._over_share(client):
                self.waiting.remove(entry)
                _count(self.waiting_of, client, -1)
                self._dispatch(sock_index, conn, context)

    def _dispatch(self, sock_index, conn, context):
        """Hand the connection to a worker (it is closed here either way)."""
        try:
            job = marshal.dumps((sock_index, context))
            worker = self.idle.take()
            for attempt in range(2):
                if worker is None:
                    # forked while the connection is open: the worker must not keep it
                    worker = self._spawn([conn])
                    if worker is None:      # no fork possible: the client may try again
                        return
                try:
                    workers.send(worker.channel, job, [conn.fileno()])
                    break
                except OSError:             # it died since it was idle: one more try
                    self._drop(worker)
                    worker = None
            else:
                return
        finally:
            conn.close()
        worker.busy, worker.job = True, context
        worker.uses += 1
        client = self.client_of(context)
        if client is not None:
            _count(self.active, client, 1)
            self.counted += 1

    def _spawn(self, also_close=()):
        """A new worker, or None when the fork fails."""
        close = list(self.listening) + [w.channel for w in self.pool.values()] + list(self._wake)
        close.append(self._selector)
        close.extend(also_close)
        try:
            worker = workers.fork(self._worker_main, close)
        except OSError:
            return None
        self.pool[worker.fileno()] = worker
        self._selector.register(worker.channel, selectors.EVENT_READ, worker)
        return worker

    def _from_worker(self, worker):
        try:
            packet = workers.receive(worker.channel)
        except OSError:
            packet = None
        if worker.busy:
            worker.busy = False
            context, worker.job = worker.job, None
            client = self.client_of(context)
            if client is not None:
                _count(self.active, client, -1)
                self.counted -= 1
        if packet is None:                  # the worker is gone
            self._drop(worker)
        elif worker.uses >= self.max_use:
            self._retire(worker)
        else:
            self._idle(worker)

    def _idle(self, worker):
        self.idle.add(worker)

    def _retire(self, worker):
        """No more work for it: it reads EOF and exits once its job (if any) is done."""
        self._drop(worker)

    def _drop(self, worker):
        self.idle.remove(worker)
        if self.pool.pop(worker.fileno(), None) is not None:
            self._selector.unregister(worker.channel)
        worker.channel.close()

    # -- in a worker -----------------------------------------------------------
    def _worker_main(self, channel):
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        self.worker_started()
        import socket
        while True:
            job = workers.next_job(channel, 1)
            if job is None:
                return 0
            payload, fds = job
            conn = socket.socket(fileno=fds[0])
            try:
                sock_index, context = marshal.loads(payload)
                conn.setblocking(True)
                status = self.child(sock_index, conn, context)
                # The server hears of the end before the client sees the connection close
                # (below): a client that reconnects at once no longer counts as connected.
                try:
                    workers.send(channel, b"%d" % (status if isinstance(status, int) else 111))
                except OSError:
                    return 0                # the server is gone
            finally:
                conn.close()
                self.let_go()


def _count(counts, key, step):
    left = counts.get(key, 0) + step
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def _drain(fd):
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
