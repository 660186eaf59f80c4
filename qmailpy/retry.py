"""qmail's retry schedule (docs/qmail-send.md "Scheduling and retries"): retry = birth + (floor(sqrt(now - birth)) + skip)^2.

qmail-send schedules by it and qmail-audit checks observed passes against it.
"""
from math import isqrt

SKIP = {"local": 10, "remote": 20}


def next_retry(birth, now, channel):
    n = 0 if birth > now else isqrt(now - birth)
    n += SKIP[channel]
    return birth + n * n


def is_dying(birth, now, lifetime):
    """True once the message is older than queuelifetime: its next deferral becomes a failure."""
    return now > birth + lifetime
