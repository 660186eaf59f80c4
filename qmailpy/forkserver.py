"""The accept loop shared by qmail-smtpd-listen and qmail-qmqpd: fork one child per connection.

A ForkingServer accepts on its listening sockets and forks once per accepted
connection; the child runs the subclass's child() with the connection and leaves
with its return value as exit status. No exec: what the server loaded before
serving is already there in the child, and gc.freeze() keeps those pages shared.
At most `limit` children run at once; further connections wait in the kernel's
backlog. admit() runs in the server before the fork, so a refused client costs
no fork. SIGTERM or SIGINT closes the listening sockets and ends the loop;
children in progress finish on their own.
"""
import errno
import gc
import os
import select
import signal

REFUSED = object()          # admit(): close the connection unanswered

# accept() errors that mean "nothing to take now", not a broken socket
_TRANSIENT = (errno.EAGAIN, errno.ECONNABORTED, errno.EINTR, errno.EMFILE, errno.ENFILE,
              errno.ENOBUFS, errno.ENOMEM)


class ForkingServer:
    def __init__(self, listening, limit):
        self.listening = list(listening)
        for sock in self.listening:
            sock.setblocking(False)
        self.limit = limit
        self.children = set()
        self._stop = False
        self._wake = None

    # -- for subclasses ------------------------------------------------------
    def admit(self, sock, conn, remote):
        """Before the fork: a context for child(), or REFUSED."""
        return None

    def child(self, sock, conn, remote, context):
        """In the child, with conn blocking: the exit status."""
        raise NotImplementedError

    def forked(self, pid, context):
        """In the server, after child pid was forked with admit()'s context."""

    def reaped(self, pid):
        """In the server, once child pid has ended and been waited for."""

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
        gc.freeze()              # objects that exist now are never collected in a child
        try:
            if ready is not None:
                ready()
            while not self._stop:
                self._reap()
                wanted = [wake_r]
                if len(self.children) < self.limit:
                    wanted += self.listening
                try:
                    readable, _, _ = select.select(wanted, [], [])
                except InterruptedError:
                    continue
                if wake_r in readable:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                for sock in self.listening:
                    if sock in readable:
                        # every waiting connection, up to the limit, per wake-up
                        while (not self._stop and len(self.children) < self.limit
                               and self._accept(sock)):
                            pass
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in old.items():
                signal.signal(s, handler)
            os.close(wake_r)
            os.close(wake_w)
            for sock in self.listening:
                sock.close()
        return 0

    def _reap(self):
        while self.children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                for pid in self.children:
                    self.reaped(pid)
                self.children.clear()
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.reaped(pid)

    def _accept(self, sock):
        """Accept and fork one connection; False when none was waiting (or no fork)."""
        try:
            conn, remote = sock.accept()
        except OSError as e:
            if e.errno in _TRANSIENT:
                return False
            raise
        context = self.admit(sock, conn, remote)
        if context is REFUSED:
            conn.close()
            return True
        try:
            pid = os.fork()
        except OSError:
            conn.close()
            return False
        if pid == 0:
            code = 111
            try:
                signal.set_wakeup_fd(-1)
                for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(s, signal.SIG_DFL)
                for fd in self._wake:
                    os.close(fd)
                for listening in self.listening:
                    listening.close()
                conn.setblocking(True)
                code = self.child(sock, conn, remote, context)
            finally:
                os._exit(code)
        self.children.add(pid)
        self.forked(pid, context)
        conn.close()
        return True
