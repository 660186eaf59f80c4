"""qmail-inject's address rewriting (docs/submission.md "qmail-inject")."""


class Rewriter:
    def __init__(self, defaulthost, defaultdomain, plusdomain):
        self.defaulthost = defaulthost
        self.defaultdomain = defaultdomain
        self.plusdomain = plusdomain

    def __call__(self, addr):
        """`<>` and `x@[]` stay; else fill in defaulthost / plusdomain / defaultdomain."""
        if not addr or addr.endswith(b"@[]"):
            return addr
        while addr and addr[-1:] in (b".", b"@"):
            addr = addr[:-1]
        if not addr:
            return addr
        at = addr.rfind(b"@")
        if at < 0:
            local, host = addr, self.defaulthost
        else:
            local, host = addr[:at], addr[at + 1:]
        if host.endswith(b"+"):
            host = host[:-1] + b"." + self.plusdomain
        if b"." not in host and not host.startswith(b"["):
            host = host + b"." + self.defaultdomain
        return local + b"@" + host
