"""The one DNS resolver setup every qmailpy lookup uses (docs/control-files.md "DNS").

control/dnsresolvers, when it exists, lists the name servers to ask (one `IP`,
`IP:port`, `[IPv6]` or `[IPv6]:port` a line, tried in that order) instead of
/etc/resolv.conf's. control/timeoutdns is the deadline in seconds of one lookup
(all its tries and servers together). Nothing here does the lookup itself:
remote/dns.py turns dnspython's answers and errors into its own.

`settings(home)` reads both files (ControlError on a bad line); `build(settings)`
makes the dnspython Resolver, importing dnspython only then.
"""
import socket

from qmailpy.home import ControlError, control_int, control_list

CONTROL = "dnsresolvers"
TIMEOUT_CONTROL = "timeoutdns"
DEFAULT_TIMEOUT = 30
DNS_PORT = 53
# Each server is given at most this long per try before the next one is asked.
TRY_TIMEOUT = 5.0


def _address(text, family):
    try:
        socket.inet_pton(family, text)
    except (OSError, ValueError):
        return False
    return True


def parse_server(line):
    """(address text, port) of one dnsresolvers line; raises ValueError."""
    text = line.decode("ascii", "replace").strip()
    port = DNS_PORT
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError("no ] after the IPv6 address")
        address, rest = text[1:close], text[close + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ValueError("junk after ]")
            port = rest[1:]
        family = socket.AF_INET6
    elif text.count(":") > 1:
        address, family = text, socket.AF_INET6
    else:
        address, _, given = text.partition(":")
        if _:
            port = given
        family = socket.AF_INET
    if not _address(address, family):
        raise ValueError("not an IP address")
    if not isinstance(port, int):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("bad port")
        port = int(port)
    return address, port


class Settings:
    """servers: [(address, port)] from control/dnsresolvers, None to use /etc/resolv.conf;
    timeout: seconds one lookup may take."""
    __slots__ = ("servers", "timeout")

    def __init__(self, servers=None, timeout=DEFAULT_TIMEOUT):
        self.servers, self.timeout = servers, timeout


def settings(home):
    """The Settings of a home; raises ControlError when a file cannot be read or a line is bad."""
    lines = control_list(home, CONTROL)
    servers = None
    if lines is not None:
        servers = []
        for line in lines:
            try:
                servers.append(parse_server(line))
            except ValueError as e:
                raise ControlError("control/%s: %r: %s" % (CONTROL, line, e)) from None
        if not servers:
            raise ControlError("control/%s lists no server" % CONTROL)
    return Settings(servers, control_int(home, TIMEOUT_CONTROL, DEFAULT_TIMEOUT, low=1))


def build(config):
    """A dnspython Resolver for Settings config. Raises dns.resolver.NoResolverConfiguration
    (or OSError) when there is no dnsresolvers and /etc/resolv.conf cannot be used."""
    import dns.nameserver
    import dns.resolver
    if config.servers is None:
        res = dns.resolver.Resolver()
    else:
        res = dns.resolver.Resolver(configure=False)
        res.nameservers = [dns.nameserver.Do53Nameserver(a, p) for a, p in config.servers]
    res.lifetime = float(config.timeout)
    res.timeout = min(TRY_TIMEOUT, res.lifetime)
    return res
