"""Network checks and ports for the tests: whether this machine has an IPv6 loopback
(needs_ipv6 skips a test without one) and a port nothing listens on (dead_port).
"""
import socket

import pytest


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")


def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()           # nothing listens there now: a refused connection
    return port
