"""RFC 4865's FUTURERELEASE: a submitting client asks that its message be held until a time.

`MAIL FROM:<a> HOLDFOR=SECONDS` or `HOLDUNTIL=DATE-TIME` (RFC 3339, UTC or with an offset).
qmail-smtpd offers and accepts it only to clients allowed to relay (RELAYCLIENT, or after
AUTH); the time becomes the message's not-before time (docs/queue-format.md "Not-before
time"), carried to qmail-qmqpd in the local socket's option (qmailpy.queue.qmqp).
"""
import re

from qmailpy.mess import MAX_HOLD

R_SYNTAX = b"501 syntax error in HOLDFOR or HOLDUNTIL (#5.5.4)\r\n"
R_TOO_LONG = b"501 sorry, that hold is longer than I allow (#5.5.4)\r\n"
R_DENIED = b"550 sorry, only clients allowed to relay may hold mail (#5.7.1)\r\n"
R_UNAVAILABLE = b"555 sorry, holds are not available here (#5.5.4)\r\n"

_DATE_TIME = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.\d+)?"
                        rb"(?:([Zz])|([+-])(\d\d):(\d\d))\Z")


class Refused(ValueError):
    """The hold parameter cannot be honoured; .reply is the SMTP reply."""

    def __init__(self, reply):
        super().__init__(reply)
        self.reply = reply


def keyword(now):
    """The EHLO line's text: the longest interval and the latest time offered."""
    return b"FUTURERELEASE %d %s" % (MAX_HOLD, utc_text(int(now) + MAX_HOLD))


def utc_text(epoch):
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)).encode()


def hold_parameter(rest, now, allowed, available=True):
    """Epoch seconds to hold until from the ESMTP parameters after a MAIL address, None
    without one (or for a time already come, which RFC 4865 leaves to the server:
    delivered now); Refused for a bad, too long or not allowed hold. available: False
    when the hold could not reach the queue ($QMAILQUEUE names another program)."""
    holds = [word for word in rest.split(b" ")
             if word[:8].upper() == b"HOLDFOR=" or word[:10].upper() == b"HOLDUNTIL="
             or word.upper() in (b"HOLDFOR", b"HOLDUNTIL")]
    if not holds:
        return None
    if not available:
        raise Refused(R_UNAVAILABLE)
    if not allowed:
        raise Refused(R_DENIED)
    if len(holds) > 1:
        raise Refused(R_SYNTAX)
    word = holds[0]
    if word[:8].upper() == b"HOLDFOR=":
        seconds = word[8:]
        if not seconds.isdigit() or len(seconds) > 9:
            raise Refused(R_SYNTAX)
        until = int(now) + int(seconds)
    else:
        until = _epoch(word[10:])
    if until - now > MAX_HOLD:
        raise Refused(R_TOO_LONG)
    return until if until > now else None


def _epoch(text):
    import calendar
    match = _DATE_TIME.match(text)
    if match is None:
        raise Refused(R_SYNTAX)
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if not (year >= 1 and 1 <= month <= 12 and hour <= 23 and minute <= 59 and second <= 60):
        raise Refused(R_SYNTAX)
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        raise Refused(R_SYNTAX)
    epoch = calendar.timegm((year, month, day, hour, minute, min(second, 59), 0, 0, 0))
    if match.group(8) is not None:
        offset_hours, offset_minutes = int(match.group(9)), int(match.group(10))
        if offset_hours > 23 or offset_minutes > 59:
            raise Refused(R_SYNTAX)
        offset = offset_hours * 3600 + offset_minutes * 60
        epoch -= offset if match.group(8) == b"+" else -offset
    return epoch
