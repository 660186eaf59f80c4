"""Long-lived worker processes: a job handed over a socket pair instead of a fork per job.

A server (qmail-smtpd-listen, qmail-qmqpd, qmail-lspawn) forks a worker once, with no exec,
so the worker starts with everything the server had loaded, and then hands it job
after job: one packet of a few bytes with at most MAX_FDS file descriptors
(SCM_RIGHTS: an accepted connection, a message file, a report pipe). The worker
answers each job with one packet when it is done. A worker serves one job at a
time, so a crash loses only the job it was doing; the server sees its end of the
socket pair become readable with nothing in it (EOF) and counts that job as lost.

The socket pair is SOCK_SEQPACKET: every packet arrives whole or not at all, and
the end of the other side reads as an empty packet. No packet of ours is empty.

A server retires a worker by closing its end: the worker reads EOF when it next
waits for a job and exits; a job already handed over is finished first. This is
how max_use (jobs per worker) and max_idle (seconds a worker may wait for work)
are enforced, by the server alone, so a job is never handed to a worker that has
decided to exit.
"""
import os
import socket

MAX_FDS = 4
MAX_PACKET = 65536


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
