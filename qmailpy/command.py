"""qmail-send's command channel, queue/command/ (docs/qmail-send.md "Commands"): the one definition of its files.

`qmailctl queue delete|hold|release|requeue|bounce` asks the running qmail-send to
act on messages; qmail-send never has its queue changed behind its back.

  command/NAME        a command, written whole under a dot-name and renamed into
                      place, then the trigger is pulled. NAME has no dot.
  command/NAME.work   claimed by qmail-send (renamed): being carried out. Left by
                      a crash, it is carried out again at the next start.
  command/NAME.reply  qmail-send's answer (renamed into place once complete); the
                      command's author reads it and removes it.
  command/.*          being written; ignored.

A command file is ASCII lines:

  action ACTION       one of ACTIONS
  reason TEXT         bounce only: the failure text the bounce gives
  msg N               once per message number

A reply has one line per number, `N RESULT TEXT`, RESULT one of RESULTS: `done`
(carried out), `none` (not carried out: TEXT says why) or `later` (not carried out
for a reason that passes: a queue error, a message not yet preprocessed; try again). A file that does not
parse is logged by qmail-send, removed and not answered.
"""
import os

from qmailpy.fileio import fsync_dir, write_all

COMMAND_DIR = "command"
ACTIONS = ("delete", "hold", "release", "requeue", "bounce")
WORK, REPLY = ".work", ".reply"
DONE, NONE, LATER = "done", "none", "later"
RESULTS = (DONE, NONE, LATER)
MAX_COMMAND = 16 * 1024 * 1024     # bytes; a longer file is garbage
MAX_REASON = 1000


class CommandError(ValueError):
    """A command file that does not parse; str() says why."""


class Command:
    __slots__ = ("action", "reason", "numbers")

    def __init__(self, action, numbers, reason=None):
        self.action, self.numbers, self.reason = action, list(numbers), reason


def encode(command):
    if command.action not in ACTIONS:
        raise CommandError("unknown action %r" % command.action)
    lines = ["action " + command.action]
    if command.action == "bounce":
        lines.append("reason " + check_reason(command.reason))
    lines.extend("msg %d" % n for n in command.numbers)
    return ("\n".join(lines) + "\n").encode("ascii")


def check_reason(reason):
    """The bounce reason, or CommandError: printable ASCII on one line."""
    if not reason or len(reason) > MAX_REASON or not all(" " <= ch <= "~" for ch in reason):
        raise CommandError("a bounce reason is 1 to %d printable ASCII characters" % MAX_REASON)
    return reason


def decode(data):
    """The Command in a file's bytes; CommandError when it is not one."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise CommandError("not ASCII")
    if not text.endswith("\n"):
        raise CommandError("incomplete last line")
    action, reason, numbers = None, None, []
    for line in text[:-1].split("\n"):
        key, _, value = line.partition(" ")
        if key == "action" and action is None and value in ACTIONS:
            action = value
        elif key == "reason" and reason is None:
            reason = check_reason(value)
        elif key == "msg" and value.isdigit() and len(value) <= 20:
            numbers.append(int(value))
        else:
            raise CommandError("unknown line %r" % line[:80])
    if action is None:
        raise CommandError("no action")
    if (action == "bounce") != (reason is not None):
        raise CommandError("a reason belongs to bounce, and bounce needs one")
    return Command(action, numbers, reason)


def encode_reply(results):
    """results: [(n, RESULT, text)]."""
    return "".join("%d %s %s\n" % item for item in results).encode("ascii", "replace")


def decode_reply(data):
    """[(n, result, text)] of a reply file."""
    results = []
    for line in data.decode("ascii", "replace").splitlines():
        n, result, text = (line.split(" ", 2) + ["", ""])[:3]
        results.append((int(n), result, text))
    return results


def write_atomically(directory, name, data, mode=0o600):
    """directory/name appears whole or not at all (written as .name, synced, renamed).
    A command is written 0644 (qmailctl may run as root, qmail-send as qmails: the
    directory, 0700, keeps everyone else out)."""
    tmp = os.path.join(directory, "." + name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)
        os.fsync(fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))
    fsync_dir(directory)
