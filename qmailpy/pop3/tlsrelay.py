"""After STLS: the process splits in two. The original process relays bytes between
the TLS connection and one end of a socket pair until either side closes; the new
one goes on with the POP3 session with the other end as its fds 0 and 1, so that
the programs it runs (checkpassword, qmail-pop3d) talk through TLS without knowing."""
import os
import select
import socket

from qmailpy.pop3.conn import TIMEOUT

CHUNK = 16384


def split(secure):
    """Returns in the child, whose fds 0 and 1 are now the clear side; the parent relays
    and exits."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        os.dup2(theirs.fileno(), 0)
        os.dup2(theirs.fileno(), 1)
        theirs.close()
        ours.close()
        os.close(secure.detach())   # the TLS state stays with the relay
        return
    theirs.close()
    try:
        relay(secure, ours)
    finally:
        os._exit(1)


def relay(secure, clear):
    for fd in (0, 1):
        try:
            os.close(fd)
        except OSError:
            pass
    secure.settimeout(TIMEOUT)
    poller = select.poll()
    poller.register(secure.fileno(), select.POLLIN)
    poller.register(clear.fileno(), select.POLLIN)
    while True:
        if secure.pending():
            ready = [(secure.fileno(), select.POLLIN)]
        else:
            ready = poller.poll()
        for fd, _ in ready:
            try:
                if fd == clear.fileno():
                    data = clear.recv(CHUNK)
                    if not data:
                        return
                    secure.sendall(data)
                else:
                    data = secure.recv(CHUNK)
                    if not data:
                        return
                    clear.sendall(data)
            except (OSError, ValueError):
                return
