"""control/smtproutes: which relay, if any, carries mail for a host (docs/delivery.md "qmail-remote").

Each line is `key:relay`, split at the first ':'; lines without a ':' are
ignored. Keys match case-insensitively (ASCII), a later line with the same key
wins (qmail's constmap). A host is tried as a whole, then each `.suffix` from
the longest down, then the empty key. An empty relay means "use the MX
records". A relay may carry a port: `host:port`; an IPv6 relay is written in
brackets, `[2001:db8::1]:port` or `[IPv6:2001:db8::1]:port`.
control/tlsdestinations (remote/tls.py) matches its keys the same way.
"""

SMTP_PORT = 25


def route_table(lines):
    """{lowercased key: relay} from the list of smtproutes lines."""
    table = {}
    for line in lines or ():
        colon = line.find(b":")
        if colon < 0:
            continue
        table[line[:colon].lower()] = line[colon + 1:]
    return table


def candidate_keys(host):
    """The keys tried for host, in order: host, each '.suffix' from the longest, then ''."""
    host = host.lower()
    keys = [host]
    for i, ch in enumerate(host):
        if ch == 0x2E and i:
            keys.append(host[i:])
    if host:
        keys.append(b"")
    return keys


def find_relay(table, host):
    """The relay for host (bytes, possibly with ':port'), or None to use MX."""
    for key in candidate_keys(host):
        relay = table.get(key)
        if relay is not None:
            return relay or None
    return None


def split_relay(relay):
    """(relay host, port): the port is the leading digits after the first ':' (0 if none)
    that follows the host; a host in brackets ends at its ']'."""
    start = relay.find(b"]") + 1 if relay.startswith(b"[") else 0
    colon = relay.find(b":", start)
    if colon < 0:
        return relay, SMTP_PORT
    digits = b""
    for ch in relay[colon + 1:]:
        if not 0x30 <= ch <= 0x39:
            break
        digits += bytes((ch,))
    return relay[:colon], (int(digits) if digits else 0) & 0xFFFF
