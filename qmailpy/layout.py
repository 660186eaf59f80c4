"""Paths inside QMAILHOME/queue (docs/queue-format.md "Queue directory layout"): split directories and inode naming.

Message number n is the inode of its mess file; split directories are n mod 23.
Only names of digits are message numbers; everything else in a queue directory
is ignored.
"""
import os

SPLIT = 23
CHANNELS = ("local", "remote")    # the two delivery channels, in this order everywhere
SPLIT_DIRS = ("mess", "info") + CHANNELS
FLAT_DIRS = ("pid", "intd", "todo", "bounce", "lock")
QUEUE_DIRS = ("pid", "mess", "intd", "todo", "info", "local", "remote", "bounce", "lock")


def split_of(n):
    return n % SPLIT


def relpath(kind, n):
    """Path of message n's file of the given kind, relative to the queue directory."""
    if kind in SPLIT_DIRS:
        return "%s/%d/%d" % (kind, n % SPLIT, n)
    if kind in ("intd", "todo", "bounce", "hold"):
        return "%s/%d" % (kind, n)
    raise ValueError("no per-message file in %s/" % kind)


def queue_dir(home):
    return os.path.join(home, "queue")


def is_number(name):
    return name.isdigit() and name.isascii()


def numbers_in(directory):
    """Message numbers named in one directory (non-digit names ignored)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [int(name) for name in names if is_number(name)]


def numbers_in_split(queue, kind):
    """(n, split) for every message number under kind/0..22."""
    found = []
    for s in range(SPLIT):
        for n in numbers_in(os.path.join(queue, kind, str(s))):
            found.append((n, s))
    return found
