"""The Received line qmail-smtpd writes before the message (docs/submission.md "qmail-smtpd")."""
from qmailpy.envelope import date822

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.@%+/=:-[]")


def safe(value):
    return bytes(ch if ch in _SAFE else 63 for ch in value)


def received_line(remotehost, helo, remoteinfo, remoteip, local, when=None, protocol=b"SMTP"):
    """helo is None unless a HELO/EHLO argument differs (case-insensitively) from remotehost;
    protocol is what follows "with" (SMTP, UTF8SMTP, the TLS patch's "(... encrypted) SMTP")."""
    parts = [b"Received: from ", safe(remotehost)]
    if helo is not None:
        parts += [b" (HELO ", safe(helo), b")"]
    parts.append(b" (")
    if remoteinfo is not None:
        parts += [safe(remoteinfo), b"@"]
    parts += [safe(remoteip), b")\n  by ", safe(local), b" with ", protocol, b"; ", date822(when), b"\n"]
    return b"".join(parts)
