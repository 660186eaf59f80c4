"""MAIL/RCPT arguments and the checks made on their addresses (docs/submission.md "qmail-smtpd").

addrparse() is qmail-smtpd's: with a '<' the address runs to the first
unquoted '>', otherwise from after the first ':' (spaces skipped) to the first
space; a source route is cut; quotes dropped; backslash escapes the next byte.
"""
import re

MAX_ADDRESS = 899

_BRACKET_IP = re.compile(rb"\[(\d+)\.(\d+)\.(\d+)\.(\d+)\]\Z")


def addrparse(arg):
    """(address, rest) from a MAIL/RCPT argument; rest is what follows the address."""
    lt = arg.find(b"<")
    if lt >= 0:
        terminator = 62                 # '>'
        pos = lt + 1
    else:
        terminator = 32                 # ' '
        colon = arg.find(b":")
        pos = len(arg) if colon < 0 else colon + 1
        while pos < len(arg) and arg[pos] == 32:
            pos += 1
    if arg[pos:pos + 1] == b"@":        # source route: @a,@b:user@host
        colon = arg.find(b":", pos)
        pos = len(arg) if colon < 0 else colon + 1
    out = bytearray()
    escaped = quoted = False
    i = pos
    n = len(arg)
    while i < n:
        ch = arg[i]
        i += 1
        if escaped:
            out.append(ch)
            escaped = False
        elif not quoted and ch == terminator:
            break
        elif ch == 92:
            escaped = True
        elif ch == 34:
            quoted = not quoted
        else:
            out.append(ch)
    return bytes(out), arg[i:]


def size_parameter(rest):
    """The SIZE= value among the ESMTP parameters after the address, or None."""
    for word in rest.split(b" "):
        if word[:5].upper() == b"SIZE=":
            digits = word[5:]
            if digits.isdigit():
                return int(digits)
    return None


def smtputf8_parameter(rest):
    """True when the ESMTP parameters after a MAIL address include SMTPUTF8 (RFC 6531)."""
    return any(word.upper() == b"SMTPUTF8" for word in rest.split(b" "))


def localiphost_rewrite(addr, liphost, is_local_ip):
    """user@[d.d.d.d] naming this host -> user@{localiphost}."""
    at = addr.rfind(b"@")
    if at < 0:
        return addr
    m = _BRACKET_IP.match(addr, at + 1)
    if not m:
        return addr
    ip = ".".join(str(int(part) & 255) for part in m.groups())
    if is_local_ip(ip):
        return addr[:at + 1] + liphost
    return addr


def badmailfrom(addr, entries):
    """entries: the lowercased badmailfrom lines as a set."""
    if not entries:
        return False
    low = addr.lower()
    if low in entries:
        return True
    at = low.rfind(b"@")
    return at >= 0 and low[at:] in entries


def rcpt_allowed(addr, rcpthosts, more_lookup):
    """rcpthosts None = absent file = accept all; more_lookup(key) consults morercpthosts.cdb."""
    if rcpthosts is None:
        return True
    at = addr.rfind(b"@")
    if at < 0:
        return True
    host = addr[at + 1:].lower()
    keys = [host[j:] for j in range(len(host)) if j == 0 or host[j] == 46]
    for key in keys:
        if key in rcpthosts:
            return True
    if more_lookup is not None:
        for key in keys:
            if more_lookup(key):
                return True
    return False
