"""A small forking TCP listener for qmail-smtpd (what tcpserver does for qmail).

For each connection the listener forks; the child sets the tcpserver
environment (PROTO=TCP, TCPREMOTEIP/PORT, TCPLOCALIP/PORT, TCPLOCALHOST), puts
the connection on fds 0 and 1 and runs the session code directly: no exec, so
a connection costs a fork, not an interpreter start. At most `limit` children
run at once; further connections wait in the kernel's backlog. SIGTERM (or
SIGINT) closes the listening socket and ends the listener; sessions in progress
finish on their own.
"""
import errno
import gc
import os
import select
import signal
import socket


class Listener:
    def __init__(self, host, port, handler, limit=40, local_host=None, environ=None):
        """handler(environ) -> exit status, run in the child with fds 0/1 connected."""
        self.handler = handler
        self.limit = limit
        self.local_host = local_host
        self.environ = dict(os.environ if environ is None else environ)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self.children = set()
        self._stop = False

    def _on_term(self, signum, frame):
        self._stop = True

    def serve(self, ready=None):
        """Accept until SIGTERM/SIGINT; ready() is called once the signal handlers are set."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        old = {s: signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)}
        old_wakeup = signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        # Objects that exist now are never collected in a child, so forks share their pages.
        gc.freeze()
        try:
            if ready is not None:
                ready()
            while not self._stop:
                self._reap()
                ready = [wake_r]
                if len(self.children) < self.limit:
                    ready.append(self.sock)
                try:
                    readable, _, _ = select.select(ready, [], [])
                except InterruptedError:
                    continue
                if wake_r in readable:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                if self.sock in readable:
                    # take every waiting connection, up to the limit, per wake-up
                    while not self._stop and len(self.children) < self.limit:
                        if not self._accept(wake_r, wake_w):
                            break
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in old.items():
                signal.signal(s, handler)
            os.close(wake_r)
            os.close(wake_w)
            self.sock.close()
        return 0

    def _reap(self):
        while self.children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)

    def _accept(self, wake_r, wake_w):
        """Accept and fork one connection; False when none was waiting (or accept failed)."""
        try:
            conn, remote = self.sock.accept()
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EINTR, errno.EMFILE,
                           errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                return False
            raise
        conn.setblocking(True)
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
                os.close(wake_r)
                os.close(wake_w)
                self.sock.close()
                code = self._child(conn, remote)
            finally:
                os._exit(code)
        self.children.add(pid)
        conn.close()
        return True

    def _child(self, conn, remote):
        local = conn.getsockname()
        env = self.environ
        env["PROTO"] = "TCP"
        env["TCPREMOTEIP"] = remote[0]
        env["TCPREMOTEPORT"] = str(remote[1])
        env["TCPLOCALIP"] = local[0]
        env["TCPLOCALPORT"] = str(local[1])
        if self.local_host is not None:
            env["TCPLOCALHOST"] = self.local_host
        for name in ("TCPREMOTEHOST", "TCPREMOTEINFO"):
            env.pop(name, None)
        os.dup2(conn.fileno(), 0)
        os.dup2(conn.fileno(), 1)
        conn.close()
        os.environ.clear()
        os.environ.update(env)
        return self.handler(env)
