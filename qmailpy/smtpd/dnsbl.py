"""DNS blocklists at connect, as rblsmtpd does (docs/submission.md "DNSBLs").

control/dnsbl lists zones, one a line, `zone` or `zone:451` / `zone:553` (the reply
code for a listed client; 451 by default, as rblsmtpd without -b). The client's
address (TCPREMOTEIP) is looked up in each zone in order (IPv4: its octets reversed,
IPv6: its 32 nibbles reversed, then the zone) through the resolver setup of every
qmailpy lookup (qmailpy/resolver.py); the first zone with an A record lists it, and
the zone's TXT record for the name is the reply's text. A lookup that fails
temporarily is a 451, never a pass. Relay clients (RELAYCLIENT) are not looked up;
qmail-smtpd lets a listed client authenticate (EHLO, STARTTLS, AUTH) and answers
every other command but QUIT, RSET and NOOP with the reply until AUTH succeeds.
"""
import socket

from qmailpy.home import ControlError

CONTROL = "dnsbl"
CODES = (b"451", b"553")
TEXT_MAX = 400
TEMPORARY = b"451 temporary DNSBL lookup error (#4.3.0)\r\n"
ALLOWED = frozenset((b"quit", b"rset", b"noop", b"helo", b"ehlo", b"starttls", b"auth"))


def zones(lines):
    """[(zone, code)] from control/dnsbl lines; raises ControlError on a bad line."""
    found = []
    for line in lines:
        zone, _, code = line.strip().partition(b":")
        zone = zone.rstrip(b".").lower()
        code = code or CODES[0]
        labels = zone.split(b".")
        if not zone or not all(labels) or code not in CODES or not zone.isascii():
            raise ControlError("control/%s: %r is not zone or zone:451 or zone:553" % (CONTROL, line))
        found.append((zone, code))
    return found


def query_name(ip, zone):
    """The name to look up for address text ip in zone (bytes), or None if ip is no address."""
    text = ip.decode("ascii", "replace")
    try:
        packed = socket.inet_pton(socket.AF_INET, text)
        labels = [b"%d" % b for b in reversed(packed)]
    except OSError:
        try:
            packed = socket.inet_pton(socket.AF_INET6, text)
        except OSError:
            return None
        labels = [c.encode("ascii") for c in reversed(packed.hex())]
    return b".".join(labels) + b"." + zone


def _text(rdatas):
    for rd in rdatas:
        joined = b"".join(rd.strings)
        return bytes(ch if 32 <= ch < 127 else 0x3F for ch in joined)[:TEXT_MAX]
    return b""


def check(ip, table, lookup):
    """(reply bytes, log text) when ip is listed in one of table's zones or a lookup failed
    temporarily; None when it is not listed."""
    from qmailpy.remote.dns import DNSHard, DNSSoft
    for zone, code in table:
        name = query_name(ip, zone)
        if name is None:
            return None
        try:
            lookup(name, "A")
        except DNSHard:
            continue
        except DNSSoft as e:
            return TEMPORARY, b"%s: lookup of %s failed: %s" % (
                zone, ip, str(e).encode("utf-8", "replace")[:200])
        try:
            text = _text(lookup(name, "TXT"))
        except (DNSHard, DNSSoft):
            text = b""
        text = text or b"%s is listed in %s" % (ip, zone)
        return code + b" " + text + b"\r\n", b"%s lists %s: %s" % (zone, ip, text)
    return None


def at_connect(home, cfg):
    """check() for the session's client (not a relay client), or None without control/dnsbl.
    Raises ControlError when control/dnsbl or the resolver's files cannot be read."""
    from qmailpy.home import control_list
    table = zones(control_list(home, CONTROL, []))
    if not table:
        return None
    from qmailpy import resolver
    from qmailpy.remote.dns import resolver_lookup
    return check(cfg.remoteip, table, resolver_lookup(config=resolver.settings(home)))


def preload():
    """Import what a lookup needs (qmail-smtpd-listen, once for all its session workers)."""
    import dns.nameserver       # noqa: F401
    import dns.resolver         # noqa: F401
    import qmailpy.remote.dns   # noqa: F401
    import qmailpy.resolver     # noqa: F401
