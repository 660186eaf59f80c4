"""Read-only view of a directory queue, as qmail-qread and qmail-qstat see it (docs/queue-format.md "qmail-qread and qmail-qstat").

list_messages() walks info/0..22 (inside each, in ascending message number:
qmail lists in readdir order, which depends on the filesystem; a fixed order
lets the log backend show exactly the same listing) and reads, for every preprocessed message, info (sender, and its
mtime = birth), the size of mess, whether bounce/n exists, and the records of
local then remote. A file that cannot be read makes that message's view carry
an `error` (qmail-qread prints it as a warning) instead of its details.
"""
import errno
import os

from qmailpy import states
from qmailpy.backends.base import MessageView
from qmailpy.envelope import parse_channel, parse_info
from qmailpy.layout import CHANNELS, SPLIT, is_number

# djb's error_str() wording for the errors a reader meets.
_ERROR_TEXT = {
    errno.ENOENT: "file does not exist",
    errno.EACCES: "access denied",
    errno.EPERM: "permission denied",
    errno.EIO: "input/output error",
    errno.ENOMEM: "out of memory",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.ELOOP: "symbolic link loop",
}


class ListError(OSError):
    """A queue directory itself cannot be read (qmail-qread: fatal)."""


def error_text(exc):
    return _ERROR_TEXT.get(exc.errno, (exc.strerror or str(exc)).lower())


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _numbers(directory):
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise ListError(e.errno, "unable to opendir %s: %s" % (directory, error_text(e))) from e
    return [int(name) for name in names if is_number(name)]


def view(queue_dir, n):
    """The MessageView of one preprocessed message number."""
    s = n % SPLIT
    info = os.path.join(queue_dir, "info", str(s), str(n))
    try:
        birth = os.stat(info).st_mtime
        sender = parse_info(_read(info))
        size = os.stat(os.path.join(queue_dir, "mess", str(s), str(n))).st_size
    except OSError as e:
        return MessageView(n, states.S5, error=error_text(e))
    except ValueError:
        return MessageView(n, states.S5, error="info file does not start with F")
    try:
        os.stat(os.path.join(queue_dir, "bounce", str(n)))
        bouncing = True
    except FileNotFoundError:
        bouncing = False
    except OSError as e:
        return MessageView(n, states.S5, error=error_text(e))
    channels = {}
    for channel in CHANNELS:
        try:
            channels[channel] = parse_channel(_read(os.path.join(queue_dir, channel, str(s), str(n))))
        except FileNotFoundError:
            channels[channel] = []
        except OSError as e:
            return MessageView(n, states.S5, birth, size, sender, bouncing=bouncing, error=error_text(e))
        except ValueError as e:
            return MessageView(n, states.S5, birth, size, sender, bouncing=bouncing, error=str(e))
    return MessageView(n, states.S5, birth, size, sender, channels["local"], channels["remote"], bouncing)


def list_messages(queue_dir):
    """MessageViews of every message with an info file, in qmail-qread's order."""
    views = []
    for s in range(SPLIT):
        for n in sorted(_numbers(os.path.join(queue_dir, "info", str(s)))):
            views.append(view(queue_dir, n))
    return views


def counts(queue_dir):
    """(entries under mess/*/, entries in todo/): qmail-qstat's two numbers."""
    mess = 0
    for s in range(SPLIT):
        try:
            mess += len(os.listdir(os.path.join(queue_dir, "mess", str(s))))
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ListError(e.errno, "unable to opendir mess/%d: %s" % (s, error_text(e))) from e
    try:
        todo = len(os.listdir(os.path.join(queue_dir, "todo")))
    except OSError as e:
        raise ListError(e.errno, "unable to opendir todo: %s" % error_text(e)) from e
    return mess, todo


def _count_numbers(directory):
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    joined = "".join(names)                 # all numbers (the rule): two checks in C, not one a name
    if joined.isdigit() and joined.isascii():
        return len(names)
    return sum(1 for name in names if is_number(name))


def state_counts(queue_dir):
    """{new, preprocessed, local, remote, held, total} by directory counts (qmailctl queue
    size; qmailpy/ctl/queuesize.py defines the states): todo/, info/*, local/*, remote/*, hold/."""
    split = {kind: sum(_count_numbers(os.path.join(queue_dir, kind, str(s))) for s in range(SPLIT))
             for kind in ("info", "local", "remote")}
    todo = _numbers(os.path.join(queue_dir, "todo"))
    # preprocessing interrupted (info written, todo not yet cleaned): still new
    both = sum(1 for n in todo if os.path.exists(os.path.join(queue_dir, "info", str(n % SPLIT), str(n))))
    counts = {"new": len(todo), "preprocessed": split["info"] - both, "local": split["local"],
              "remote": split["remote"], "held": _count_numbers(os.path.join(queue_dir, "hold"))}
    counts["total"] = counts["new"] + counts["preprocessed"]
    return counts
