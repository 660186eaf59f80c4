"""The order in which one mail exchanger's addresses are tried (docs/delivery.md "IPv6").

RFC 6724 destination address selection, reduced to the rules that decide
between the AAAA and A records of one host:

- rule 1, avoid unusable destinations: an address this host has no route to
  (the kernel refuses a UDP connect() to it, which sends nothing) goes last;
- rule 6, prefer higher precedence, from the default policy table of §2.1
  (IPv4 counts as ::ffff:a.b.c.d, precedence 35): ::1 before global IPv6
  before IPv4 before 6to4, Teredo and ULA;
- rule 10, otherwise keep the order DNS gave.

The rules on source addresses (2, 3, 4, 5, 7, 8, 9) are not applied: on a host
with one route per family they never separate a mail exchanger's addresses.
"""
import socket

# (prefix as 16 bytes, prefix length, precedence) from RFC 6724 §2.1, longest prefix first.
_POLICY = sorted((
    (socket.inet_pton(socket.AF_INET6, "::1"), 128, 50),
    (socket.inet_pton(socket.AF_INET6, "::"), 0, 40),
    (socket.inet_pton(socket.AF_INET6, "::ffff:0:0"), 96, 35),
    (socket.inet_pton(socket.AF_INET6, "2002::"), 16, 30),
    (socket.inet_pton(socket.AF_INET6, "2001::"), 32, 5),
    (socket.inet_pton(socket.AF_INET6, "fc00::"), 7, 3),
    (socket.inet_pton(socket.AF_INET6, "::"), 96, 1),
    (socket.inet_pton(socket.AF_INET6, "fec0::"), 10, 1),
    (socket.inet_pton(socket.AF_INET6, "3ffe::"), 16, 1),
), key=lambda row: -row[1])

_V4MAPPED = bytes(10) + b"\xff\xff"


def _matches(addr16, prefix, length):
    full, rest = divmod(length, 8)
    if addr16[:full] != prefix[:full]:
        return False
    if rest:
        mask = (0xFF << (8 - rest)) & 0xFF
        return addr16[full] & mask == prefix[full] & mask
    return True


def precedence(ip):
    """The precedence of a 4- or 16-byte address in the default policy table."""
    addr16 = _V4MAPPED + ip if len(ip) == 4 else ip
    for prefix, length, prec in _POLICY:
        if _matches(addr16, prefix, length):
            return prec
    return 40


def routable(ip):
    """True if the kernel would pick a source address for ip (a UDP connect(); nothing is sent)."""
    family = socket.AF_INET6 if len(ip) == 16 else socket.AF_INET
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return False                     # no such family on this host
    try:
        s.connect((socket.inet_ntop(family, ip), 9))
        return True
    except OSError:
        return False
    finally:
        s.close()


def rfc6724(ips):
    """ips (DNS order) in the order to try them."""
    if len(ips) < 2:
        return list(ips)
    keyed = [(not routable(ip), -precedence(ip), i, ip) for i, ip in enumerate(ips)]
    return [row[3] for row in sorted(keyed)]
