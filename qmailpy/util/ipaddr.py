"""A client's address as qmail's tools name it."""


def unmapped(ip):
    """An IPv4 client of a dual-stack socket (ListenStream=25) as tcpserver names it:
    ::ffff:192.0.2.7 -> 192.0.2.7."""
    if ip.lower().startswith("::ffff:") and "." in ip:
        return ip[7:]
    return ip
