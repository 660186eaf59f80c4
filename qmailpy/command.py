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

qmailctl writes the numbers in ascending order; qmail-send sorts them if they are
not, and acts on each number once. A reply has one line per number, `N RESULT TEXT`,
in the order qmail-send acted, RESULT one of RESULTS: `done` (carried out), `none`
(not carried out: TEXT says why) or `later` (not carried out for a reason that
passes: a queue error, a message not yet preprocessed; try again). qmail-send
writes it as .NAME.reply while it works and renames it. A file that does not parse
is logged by qmail-send, removed and not answered.
"""
import io
import os
from array import array

from qmailpy.fileio import fsync_dir, write_all

COMMAND_DIR = "command"
ACTIONS = ("delete", "hold", "release", "requeue", "bounce")
WORK, REPLY = ".work", ".reply"
DONE, NONE, LATER = "done", "none", "later"
RESULTS = (DONE, NONE, LATER)
MAX_COMMAND = 16 * 1024 * 1024     # bytes; a longer file is garbage
MAX_REASON = 1000
MAX_NUMBER = 2 ** 64 - 1           # numbers are inodes


class CommandError(ValueError):
    """A command file that does not parse; str() says why."""


class Command:
    """numbers: an array('Q') (read()) or any sequence of ints (encode())."""
    __slots__ = ("action", "reason", "numbers")

    def __init__(self, action, numbers, reason=None):
        self.action, self.numbers, self.reason = action, numbers, reason


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


def check_number(n):
    """A message number fits an inode: 0 <= n < 2**64."""
    return 0 <= n <= MAX_NUMBER


def read(f):
    """The Command in a binary file's lines, read one line at a time: its numbers are
    an array('Q') in ascending order without repeats (8 bytes each, however many);
    CommandError when the file is not a command."""
    action, reason, numbers = None, None, array("Q")
    size, ordered = 0, True
    for raw in f:
        size += len(raw)
        if size > MAX_COMMAND:
            raise CommandError("too long")
        if not raw.endswith(b"\n"):
            raise CommandError("incomplete last line")
        try:
            line = raw[:-1].decode("ascii")
        except UnicodeDecodeError:
            raise CommandError("not ASCII")
        key, _, value = line.partition(" ")
        if key == "msg" and value.isdigit() and len(value) <= 20 and check_number(int(value)):
            n = int(value)
            if numbers and n <= numbers[-1]:
                ordered = False
            numbers.append(n)
        elif key == "action" and action is None and value in ACTIONS:
            action = value
        elif key == "reason" and reason is None:
            reason = check_reason(value)
        else:
            raise CommandError("unknown line %r" % line[:80])
    if action is None:
        raise CommandError("no action")
    if (action == "bounce") != (reason is not None):
        raise CommandError("a reason belongs to bounce, and bounce needs one")
    if not ordered:                 # qmailctl writes them in order: this is the rare case
        numbers = array("Q", sorted(set(numbers)))
    return Command(action, numbers, reason)


def decode(data):
    """read() of a command's bytes."""
    return read(io.BytesIO(data))


def encode_reply(results):
    """results: [(n, RESULT, text)]."""
    return "".join("%d %s %s\n" % item for item in results).encode("ascii", "replace")


def decode_reply(lines):
    """(n, result, text) of each line of a reply (bytes, or a binary file read line by line)."""
    if isinstance(lines, bytes):
        lines = lines.splitlines()
    for line in lines:
        n, result, text = (line.decode("ascii", "replace").rstrip("\n").split(" ", 2) + ["", ""])[:3]
        yield int(n), result, text


class ReplyWriter:
    """A reply written as its answers are decided: they are appended to .NAME.reply (at
    most FLUSH bytes wait in memory) and finish() renames it to NAME.reply, synced, so
    the author never reads part of one. OSError from add() or finish() means the reply
    is not there."""
    FLUSH = 65536

    def __init__(self, directory, name):
        self.directory = directory
        self.tmp = os.path.join(directory, "." + name + REPLY)
        self.path = os.path.join(directory, name + REPLY)
        self.buf = bytearray()
        self.started = False

    def add(self, n, result, text):
        self.buf += encode_reply([(n, result, text)])
        if len(self.buf) >= self.FLUSH:
            self._write()

    def _write(self, sync=False):
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self.started else os.O_TRUNC)
        fd = os.open(self.tmp, flags, 0o600)
        try:
            write_all(fd, self.buf)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self.started = True
        self.buf.clear()

    def finish(self):
        self._write(sync=True)
        os.rename(self.tmp, self.path)
        fsync_dir(self.directory)


def write_atomically(dir_fd, name, data, mode=0o600):
    """name appears whole or not at all in the directory dir_fd (written as .name, a
    new file, synced, renamed). A command is written 0644 (qmailctl may run as root,
    qmail-send as qmails: the directory, 0700, keeps everyone else out); root writes
    through the directory's descriptor and never follows a name qmails could plant."""
    tmp = "." + name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                 dir_fd=dir_fd)
    try:
        write_all(fd, data)
        os.fsync(fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)
