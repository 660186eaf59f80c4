"""Mail exchanger and address lookups for qmail-remote (docs/delivery.md "qmail-remote").

Lookups go through a `lookup(name, rdtype)` callable returning the answer's
records in DNS order (dnspython rdata) or raising DNSHard (the name or the data
does not exist) / DNSSoft (anything that may work later, a timeout included).
`resolver_lookup()` builds one on dnspython with res_query's rules: the name is
absolute, no search list; its servers and deadline are qmailpy.resolver's
(control/dnsresolvers, control/timeoutdns). Tests pass their own lookup.

Results are lists of (preference, address, host name) in the order they are
tried: MX hosts by increasing preference, equal preferences in the pseudo-random
order of qmail's dns_mxip(), each host's AAAA and A records in the order of
addrsort.rfc6724 (DNS order among equals). An address is 4 bytes (IPv4) or 16
(IPv6); the host name is b'' for an IP literal.
"""
import errno


class DNSSoft(Exception):
    """Temporary DNS failure."""


class DNSHard(Exception):
    """The name or the requested data does not exist."""


def _dotted(text):
    parts = text.split(b".")
    if len(parts) != 4:
        return None
    out = bytearray()
    for part in parts:
        if not part or not part.isdigit() or not part.isascii():
            return None
        out.append(int(part) & 0xFF)
    return bytes(out)


def _ipv6(text):
    import socket
    try:
        return socket.inet_pton(socket.AF_INET6, text.decode("ascii"))
    except (UnicodeDecodeError, OSError, ValueError):
        return None


def ip_literal(host):
    """The address of `1.2.3.4`, `[1.2.3.4]`, `[IPv6:2001:db8::1]` or `[2001:db8::1]`, else None."""
    if host.startswith(b"[") and host.endswith(b"]"):
        inner = host[1:-1]
        if inner[:5].lower() == b"ipv6:":
            return _ipv6(inner[5:])
        if b":" in inner:
            return _ipv6(inner)
        return _dotted(inner)
    return _dotted(host)


def format_ip(ip):
    """An address as qmail-remote reports it: dotted IPv4, or IPv6 in its shortest form."""
    if len(ip) == 16:
        import socket
        return socket.inet_ntop(socket.AF_INET6, ip).encode("ascii")
    return b"%d.%d.%d.%d" % tuple(ip)


def resolver_lookup(resolver=None, config=None):
    """A lookup(name, rdtype) on dnspython: on resolver if given, else on one built
    (at the first lookup) from config, a qmailpy.resolver.Settings (default: /etc/resolv.conf)."""
    import dns.exception
    import dns.name
    import dns.rdatatype
    import dns.resolver
    from qmailpy import resolver as setup

    made = [resolver]

    def lookup(name, rdtype):
        if not name:
            raise DNSHard("empty name")
        try:
            res = made[0]
            if res is None:
                res = made[0] = setup.build(config or setup.Settings())
            qname = dns.name.from_text(name.decode("ascii"))
        except dns.resolver.NoResolverConfiguration as e:
            raise DNSSoft(str(e)) from None
        except (UnicodeDecodeError, dns.exception.SyntaxError, dns.name.NameTooLong,
                dns.name.EmptyLabel, dns.name.LabelTooLong) as e:
            raise DNSHard(str(e)) from None
        except OSError as e:
            raise DNSSoft(str(e)) from None
        try:
            answer = res.resolve(qname, dns.rdatatype.from_text(rdtype), search=False,
                                 raise_on_no_answer=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer) as e:
            raise DNSHard(str(e)) from None
        except dns.exception.DNSException as e:          # timeouts, SERVFAIL, no servers
            raise DNSSoft(str(e)) from None
        except OSError as e:
            raise DNSSoft(str(e)) from None
        return list(answer)
    return lookup


def _host_bytes(target):
    """An MX target as bytes without the final dot (the root, a null MX, is empty)."""
    text = target.to_text() if hasattr(target, "to_text") else target
    if isinstance(text, str):
        text = text.encode("ascii", "replace")
    return text[:-1] if text.endswith(b".") else text


def addresses(host, lookup, pref=0):
    """[(pref, ip, host)] for one host: an IP literal (preference 0), else its AAAA and A records.

    Raises DNSHard only when both lookups fail hard, DNSSoft when one fails
    temporarily and the other finds nothing."""
    if host:
        literal = ip_literal(host)
        if literal is not None:
            return [(0, literal, b"")]
    import socket
    from qmailpy.remote.addrsort import rfc6724
    found = []
    failures = []
    for rdtype, family in (("AAAA", socket.AF_INET6), ("A", socket.AF_INET)):
        try:
            found.extend(socket.inet_pton(family, rd.address) for rd in lookup(host, rdtype))
        except (DNSHard, DNSSoft) as e:
            failures.append(e)
    if not found:
        soft = [e for e in failures if isinstance(e, DNSSoft)]
        if soft:
            raise soft[0]
        raise failures[0]
    return [(pref, ip, host) for ip in rfc6724(found)]


def order_mx(records, seed):
    """[(pref, name)] in DNS order -> the order qmail tries them (dns_mxip).

    Lowest preference first; among equal preferences a linear congruential
    sequence seeded with `seed` (time + pid << 16 in qmail-remote) picks each
    with equal chance. The sequence runs in 32 bits, as on the machines qmail
    was written for: in a 64-bit unsigned long the test below is almost never
    true and ties would always go the same way."""
    mx = list(records)
    random = seed & 0xFFFFFFFF
    ordered = []
    while mx:
        i = 0
        numsame = 1
        for j in range(1, len(mx)):
            if mx[j][0] < mx[i][0]:
                i = j
                numsame = 1
            elif mx[j][0] == mx[i][0]:
                numsame += 1
                random = (random * 69069 + 1) & 0xFFFFFFFF
                if random // 2 < 2147483647 // numsame:
                    i = j
        ordered.append(mx[i])
        mx[i] = mx[-1]
        mx.pop()
    return ordered


def mx_addresses(host, seed, lookup):
    """(addresses, soft) for mail to host, as qmail's dns_mxip().

    soft is True when some MX host's address lookup failed temporarily (its
    addresses are then missing). Raises DNSSoft when the MX query itself failed
    temporarily, DNSHard when the host has neither MX nor A records."""
    literal = ip_literal(host) if host else None
    if literal is not None:
        return [(0, literal, b"")], False
    try:
        records = [(rd.preference, _host_bytes(rd.exchange)) for rd in lookup(host, "MX")]
    except DNSHard:
        return addresses(host, lookup), False
    if not records:
        return addresses(host, lookup), False
    found = []
    soft = False
    for pref, name in order_mx(records, seed):
        try:
            found.extend(addresses(name, lookup, pref))
        except DNSSoft:
            soft = True
        except DNSHard:
            pass
    return found, soft


# --- this host's own addresses (qmail's ipme) --------------------------------

_SIOCGIFCONF = 0x8912
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1


def local_addresses():
    """This host's addresses (qmail's ipme, with IPv6): the IPv4 addresses of the interfaces
    that are up, plus 0.0.0.0, and the IPv6 ones /proc/net/if_inet6 lists, plus ::."""
    import array
    import fcntl
    import socket
    import struct

    found = {b"\0\0\0\0"}
    ifreq_size = 40 if struct.calcsize("P") == 8 else 32
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        size = 4096
        while True:
            buf = array.array("B", bytes(size))
            addr, _ = buf.buffer_info()
            ifc = struct.pack("iP", size, addr)
            length = struct.unpack("iP", fcntl.ioctl(s.fileno(), _SIOCGIFCONF, ifc))[0]
            if length + ifreq_size < size:
                break
            if size > 200000:
                raise OSError(errno.ENOBUFS, "too many interfaces")
            size *= 2
        data = buf.tobytes()[:length]
        for off in range(0, length - ifreq_size + 1, ifreq_size):
            req = data[off:off + ifreq_size]
            family = struct.unpack_from("H", req, 16)[0]
            if family != socket.AF_INET:
                continue
            flags_req = req[:16] + bytes(ifreq_size - 16)
            flags = struct.unpack_from("h", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, flags_req), 16)[0]
            if flags & _IFF_UP:
                found.add(req[20:24])
    finally:
        s.close()
    found.add(bytes(16))
    try:
        with open("/proc/net/if_inet6", "rb") as f:
            for line in f:
                hexaddr = line.split(b" ", 1)[0]
                if len(hexaddr) == 32:
                    found.add(bytes.fromhex(hexaddr.decode("ascii")))
    except (OSError, ValueError):
        pass              # no IPv6 on this host
    return found
