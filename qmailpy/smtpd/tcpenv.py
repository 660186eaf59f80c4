"""The tcpserver environment when qmail-smtpd is started some other way.

Under systemd socket activation (Accept=yes) the connection is fd 0 and
systemd sets REMOTE_ADDR/REMOTE_PORT; qmail-smtpd expects tcpserver's
TCPREMOTEIP and friends, which are derived here when PROTO is not set.
"""
import socket


def complete(environ, fd=0):
    """Fill in PROTO and TCP* from systemd's variables and the socket on fd."""
    if "PROTO" in environ:
        return environ
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return environ
    try:
        try:
            local = sock.getsockname()
            remote = sock.getpeername()
        except OSError:
            return environ
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return environ
        environ["PROTO"] = "TCP6" if sock.family == socket.AF_INET6 else "TCP"
        environ.setdefault("TCPREMOTEIP", environ.get("REMOTE_ADDR", remote[0]))
        environ.setdefault("TCPREMOTEPORT", environ.get("REMOTE_PORT", str(remote[1])))
        environ.setdefault("TCPLOCALIP", local[0])
        environ.setdefault("TCPLOCALPORT", str(local[1]))
    finally:
        sock.detach()
    return environ
