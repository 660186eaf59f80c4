"""The tcpserver environment when qmail-smtpd is started some other way.

Under systemd socket activation (Accept=yes) the connection is fd 0 and
systemd sets REMOTE_ADDR/REMOTE_PORT; qmail-smtpd expects tcpserver's
TCPREMOTEIP and friends, which are derived here when PROTO is not set: an IPv4
client of a dual-stack socket by its IPv4 address with PROTO=TCP, a real IPv6
client with PROTO=TCP6 and the TCP6* variables too.
"""
import socket

from qmailpy.util.ipaddr import unmapped  # noqa: F401  (listener, tcp-env)


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
        remote_ip = unmapped(environ.get("REMOTE_ADDR", remote[0]))
        local_ip = unmapped(local[0])
        ipv6 = sock.family == socket.AF_INET6 and ":" in remote_ip
        environ["PROTO"] = "TCP6" if ipv6 else "TCP"
        environ.setdefault("TCPREMOTEIP", remote_ip)
        environ.setdefault("TCPREMOTEPORT", environ.get("REMOTE_PORT", str(remote[1])))
        environ.setdefault("TCPLOCALIP", local_ip)
        environ.setdefault("TCPLOCALPORT", str(local[1]))
        if ipv6:            # as tcpserver's IPv6 version and qmail-smtpd-listen set them
            environ.setdefault("TCP6REMOTEIP", remote_ip)
            environ.setdefault("TCP6REMOTEPORT", environ["TCPREMOTEPORT"])
            environ.setdefault("TCP6LOCALIP", local_ip)
            environ.setdefault("TCP6LOCALPORT", environ["TCPLOCALPORT"])
    finally:
        sock.detach()
    return environ
