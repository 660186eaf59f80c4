"""qmail-send's recipient rewriting (docs/qmail-send.md "Recipient rewriting"): which channel, which address.

Maps are matched ASCII case-insensitively and the last line with a given key
wins, as qmail's constmap does.
"""
LOCAL, REMOTE = "local", "remote"


def _keyset(lines):
    return {line.lower() for line in lines}


def _virtual_map(lines):
    """virtualdomains lines 'key:prepend' -> {lowercased key: prepend}; lines without ':' are skipped."""
    table = {}
    for line in lines:
        colon = line.find(b":")
        if colon < 0:
            continue
        table[line[:colon].lower()] = line[colon + 1:]
    return table


class Rewriter:
    """route(address) -> (channel, rewritten address), as preprocessing needs it."""

    def __init__(self, envnoathost, locals_, percenthack=(), virtualdomains=()):
        self.envnoathost = envnoathost
        self.locals = _keyset(locals_)
        self.percenthack = _keyset(percenthack)
        self.virtual = _virtual_map(virtualdomains)

    def route(self, recipient):
        addr = recipient
        i = addr.rfind(b"@")
        if i < 0:
            addr = addr + b"@" + self.envnoathost
            i = len(recipient)
        while addr[i + 1:].lower() in self.percenthack:
            j = addr.rfind(b"%", 0, i)
            if j < 0:
                break
            addr = addr[:j] + b"@" + addr[j + 1:i]
            i = j
        at = addr.rfind(b"@")
        if addr[at + 1:].lower() in self.locals:
            return LOCAL, addr
        if self.virtual:
            for key in self._virtual_keys(addr, at):
                prepend = self.virtual.get(key.lower())
                if prepend is None:
                    continue
                if not prepend:
                    break
                return LOCAL, prepend + b"-" + addr
        return REMOTE, addr

    @staticmethod
    def _virtual_keys(addr, at):
        """The whole address, the domain, each '.suffix' longest first, then the empty key."""
        yield addr
        yield addr[at + 1:]
        for i in range(at + 1, len(addr)):
            if addr[i] == 0x2E:
                yield addr[i:]
        yield b""

    def strip_virtual_prepend(self, recip):
        """The address for a bounce note: drop 'P-' added for a virtual domain (docs/queue-format.md "bounce/n")."""
        at = recip.rfind(b"@")
        if at < 0:
            return recip
        domain = recip[at + 1:]
        keys = [domain] + [domain[i:] for i in range(len(domain)) if domain[i] == 0x2E] + [b""]
        for key in keys:
            prepend = self.virtual.get(key.lower())
            if prepend is None:
                continue
            if not prepend:
                break
            if recip[:len(prepend)] != prepend or recip[len(prepend):len(prepend) + 1] != b"-":
                break
            return recip[len(prepend) + 1:]
        return recip
