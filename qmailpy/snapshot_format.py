"""Queue snapshots: the one definition of the snapshot format (man qmail-snapshot(5)).

A snapshot is JSON Lines, one object per line, UTF-8 (bytes that are not UTF-8
travel as \\udcXX escapes, Python's surrogateescape):

1. a header  {"record": "snapshot", "format": 1, "host", "home", "backend",
   "taken", "queuelifetime"}
2. one {"record": "message", ...} per message number found (MESSAGE_FIELDS)
3. a trailer {"record": "end", "host", "messages": count}

A snapshot without its trailer, or whose count disagrees, is torn. Readers
(qmail-audit) validate each line with parse_line(); SnapshotError names what
is wrong with one line so the rest can still be used.

Writers: walk_dir(host, queue) for a directory-backend queue, walked file by
file (qmailpy.backends.snapshot.walk takes a whole live home, either backend),
and from_notqmail_text() for the text dump of a real notqmail queue (the tests
read one produced by C qmail).
"""
import errno
import json
import os
import re
import stat

from qmailpy import envelope, layout, states
from qmailpy.layout import CHANNELS
from qmailpy.states import DEFAULT_QUEUELIFETIME

FORMAT = 1
# Keys of a message record, in order. files: kind -> {path, split, size, mtime,
# atime, inode, mode, links} (atime/inode/mode/links may be null when unknown).
MESSAGE_FIELDS = ("record", "host", "n", "backend", "state", "files", "birth", "size",
                  "sender", "recipients", "bouncing", "bounce", "problems", "message_id")
FILE_FIELDS = ("path", "split", "size", "mtime", "atime", "inode", "mode", "links")
# bytes of a mess file read for its Message-ID: a header longer than this is not searched
HEADER_LIMIT = 65536


class SnapshotError(ValueError):
    """One snapshot line is not a valid record."""


def text(raw):
    """bytes from the queue as a JSON-safe str (non-UTF-8 bytes escaped)."""
    return raw.decode("utf-8", "surrogateescape")


def raw(value):
    """The inverse of text()."""
    return value.encode("utf-8", "surrogateescape")


def header(host, home, backend, taken, queuelifetime):
    return {"record": "snapshot", "format": FORMAT, "host": host, "home": home,
            "backend": backend, "taken": taken, "queuelifetime": queuelifetime}


def trailer(host, count):
    return {"record": "end", "host": host, "messages": count}


def message_record(host, n, backend, files, sender=None, recipients=(), bounce=None,
                   bouncing=None, problems=(), state=None, birth=None, size=None,
                   message_id=None):
    """A message record; state is classified from the files unless given (log backend)."""
    if state is None and backend == "dir":
        state = states.classify(files.keys())
    if birth is None and "info" in files:
        birth = files["info"]["mtime"]
    if size is None and "mess" in files:
        size = files["mess"]["size"]
    if bouncing is None:
        bouncing = "bounce" in files
    return {"record": "message", "host": host, "n": n, "backend": backend, "state": state,
            "files": files, "birth": birth, "size": size, "sender": sender,
            "recipients": list(recipients), "bouncing": bool(bouncing), "bounce": bounce,
            "problems": list(problems), "message_id": message_id}


def message_id(head):
    """The Message-ID field's value in a message's first bytes (unfolded, outer
    whitespace stripped, as text()), or None when its header has none."""
    value = None
    for line in head.split(b"\n"):
        line = line.rstrip(b"\r")
        if value is not None:
            if line[:1] in (b" ", b"\t"):
                value = (value + b" " + line.strip()).strip()
                continue
            break
        if not line:
            break                       # the end of the header
        name, colon, rest = line.partition(b":")
        if colon and name.strip().lower() == b"message-id":
            value = rest.strip()
    return text(value) if value else None


def mess_message_id(queue, meta):
    """message_id() of a mess file's first HEADER_LIMIT bytes; a line cut by the limit
    is not read."""
    head = _read_file(queue, meta, HEADER_LIMIT)
    if len(head) == HEADER_LIMIT:
        head = head[:head.rfind(b"\n") + 1]
    return message_id(head)


def recipient(channel, address, done):
    return {"channel": channel, "address": address, "done": bool(done)}


def dumps(record):
    return json.dumps(record, separators=(",", ":"), ensure_ascii=True)


# --- reading ----------------------------------------------------------------

_REQUIRED = {
    "snapshot": {"format": int, "host": str, "taken": (int, float), "queuelifetime": int},
    "message": {"host": str, "n": int, "backend": str, "files": dict, "recipients": list,
                "problems": list},
    "end": {"host": str, "messages": int},
}


def parse_line(line):
    """The record of one snapshot line; SnapshotError when it is not one."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "surrogateescape")
    try:
        record = json.loads(line)
    except ValueError as e:
        raise SnapshotError("not JSON: %s" % e) from None
    if not isinstance(record, dict):
        raise SnapshotError("not a JSON object")
    kind = record.get("record")
    if kind not in _REQUIRED:
        raise SnapshotError("unknown record type %r" % (kind,))
    for key, typ in _REQUIRED[kind].items():
        value = record.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise SnapshotError("%s record: field %r missing or of the wrong type" % (kind, key))
    if kind == "snapshot" and record["format"] != FORMAT:
        raise SnapshotError("unsupported snapshot format %r" % record["format"])
    if kind == "message":
        _check_message(record)
    return record


_NUMBER = (int, float)
_OPTIONAL = {"birth": _NUMBER, "size": int, "sender": str, "bounce": str, "bouncing": bool,
             "message_id": str}
_FILE_TYPES = {"path": str, "split": int, "size": int, "mtime": _NUMBER, "atime": _NUMBER,
               "inode": int, "mode": int, "links": int}


def _typed(value, typ):
    """value is of typ; a bool is no number here (JSON true is not 1)."""
    return isinstance(value, typ) and (typ is bool or not isinstance(value, bool))


def _check_message(record):
    """The nested fields of a message record, so readers can rely on their types."""
    if record.get("state") not in states.STATES + (None,):
        raise SnapshotError("message record: unknown state %r" % record.get("state"))
    for key, typ in _OPTIONAL.items():
        if record.get(key) is not None and not _typed(record[key], typ):
            raise SnapshotError("message record: field %r of the wrong type" % key)
    for kind_name, meta in record["files"].items():
        if kind_name not in states.FILES or not isinstance(meta, dict):
            raise SnapshotError("message record: bad file entry %r" % kind_name)
        for key, typ in _FILE_TYPES.items():
            if meta.get(key) is not None and not _typed(meta[key], typ):
                raise SnapshotError("message record: file %s: field %r of the wrong type"
                                    % (kind_name, key))
    for i, r in enumerate(record["recipients"]):
        if not (isinstance(r, dict) and _typed(r.get("channel"), str)
                and _typed(r.get("address"), str) and _typed(r.get("done"), bool)):
            raise SnapshotError("message record: recipient %d is not {channel, address, done}"
                                % (i + 1))
    for i, p in enumerate(record["problems"]):
        if not isinstance(p, str):
            raise SnapshotError("message record: problem %d is not a string" % (i + 1))


def read(lines):
    """(records, errors) for an iterable of snapshot lines: each error is (line number, text)."""
    records, errors = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(parse_line(line))
        except SnapshotError as e:
            errors.append((number, str(e)))
    return records, errors


# --- walking a live home -----------------------------------------------------

def _meta(relpath, split, st):
    return {"path": relpath, "split": split, "size": st.st_size, "mtime": st.st_mtime,
            "atime": st.st_atime, "inode": st.st_ino, "mode": st.st_mode & 0o7777,
            "links": st.st_nlink}


def _scan(directory):
    """(name, stat) of every all-digit entry of one directory."""
    try:
        entries = os.scandir(directory)
    except FileNotFoundError:
        return
    with entries:
        for entry in entries:
            if layout.is_number(entry.name):
                try:
                    yield entry.name, entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue            # gone between readdir and stat: it moved on


def _collect_files(queue):
    """n -> {kind: meta}, and n -> [problems] for the whole directory queue."""
    found, problems = {}, {}
    for kind in layout.SPLIT_DIRS:
        for split in range(layout.SPLIT):
            for name, st in _scan(os.path.join(queue, kind, str(split))):
                n = int(name)
                rel = "%s/%d/%s" % (kind, split, name)
                files = found.setdefault(n, {})
                if split != layout.split_of(n):
                    problems.setdefault(n, []).append(
                        "split-mismatch: %s is in split dir %d, expected %d"
                        % (rel, split, layout.split_of(n)))
                    if kind in files:
                        continue
                elif kind in files:
                    problems.setdefault(n, []).append(
                        "duplicate: %s also found as %s" % (rel, files[kind]["path"]))
                files[kind] = _meta(rel, split, st)
    for kind in ("intd", "todo", "bounce", "hold"):
        for name, st in _scan(os.path.join(queue, kind)):
            n = int(name)
            found.setdefault(n, {})[kind] = _meta("%s/%s" % (kind, name), None, st)
    for n, files in found.items():
        mess = files.get("mess")
        if mess is not None and mess["inode"] != n:
            problems.setdefault(n, []).append(
                "inode-mismatch: %s has inode %d" % (mess["path"], mess["inode"]))
    return found, problems


def _read_file(queue, meta, limit=-1):
    """A queue file's bytes; OSError unless it is a regular file reached without a
    symlink. Root's qmailctl queue list and qmail-qread read here, in directories
    qmails and qmailq own: a FIFO in a file's place hung root (docs/security.md).
    Links are not counted: qmail's todo/N and intd/N are one file until preprocessed."""
    path = os.path.join(queue, meta["path"])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError("%s: a symbolic link, not a regular file" % meta["path"]) from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("%s: not a regular file" % meta["path"])
        return f.read(limit)


def _dir_message(host, queue, n, files, problems):
    sender, recipients, bounce, mid = None, [], None, None
    try:
        if "mess" in files:
            mid = mess_message_id(queue, files["mess"])
        if "info" in files:
            sender = text(envelope.parse_info(_read_file(queue, files["info"])))
        for channel in CHANNELS:
            if channel in files:
                for rec in envelope.parse_channel(_read_file(queue, files[channel])):
                    recipients.append(recipient(channel, text(rec.address), rec.done))
        if "todo" in files and "info" not in files:
            todo = envelope.parse_todo(_read_file(queue, files["todo"]))
            sender = text(todo.sender)
            recipients += [recipient("todo", text(r), False) for r in todo.recipients]
            if todo.unknown:
                problems.append("unknown-record: todo/%d has %d unknown records"
                                % (n, len(todo.unknown)))
        if "bounce" in files:
            bounce = text(_read_file(queue, files["bounce"]))
    except FileNotFoundError:
        problems.append("moved: a file of message %d vanished during the walk" % n)
    except (OSError, ValueError) as e:
        problems.append("unreadable: message %d: %s" % (n, e))
    return message_record(host, n, "dir", files, sender, recipients, bounce, problems=problems,
                          message_id=mid)


def walk_dir(host, queue):
    """Message records of a directory-backend queue, in increasing number order."""
    found, problems = _collect_files(queue)
    for n in sorted(found):
        yield _dir_message(host, queue, n, found[n], problems.get(n, []))


def write(records, out):
    """Write records as snapshot lines to a text stream; returns the number of messages."""
    count = 0
    for record in records:
        out.write(dumps(record))
        out.write("\n")
        count += record["record"] == "message"
    return count


# --- notqmail text dumps (test fixtures) ------------------------------------

_TAKEN = re.compile(r"# taken at (\d+(?:\.\d+)?)")
_MSG = re.compile(r"msg (\d+)$")
_FILE = re.compile(r"  (\w+)/(?:(\d+)/)?(\d+)  size (\d+)  mtime (\d+)  mode 0o([0-7]+)"
                   r"  owner \S+  links (\d+)$")


def from_notqmail_text(lines, host, queuelifetime=DEFAULT_QUEUELIFETIME):
    """Snapshot records from the text dump of a real notqmail queue.

    The dump lists per message each file with size,
    mtime, mode and links, and the NUL-terminated records of info/local/remote/
    todo/intd one per line ('  done' marks are D records). atime and inode are
    not in the dump: inode is taken to be the number, atime is unknown.
    Raises SnapshotError when the dump has no per-message section.
    """
    taken = None
    blocks, current, kind = [], None, None
    in_messages = False
    for line in lines:
        line = line.rstrip("\n")
        m = _TAKEN.match(line)
        if m and taken is None:
            taken = float(m.group(1))
            continue
        if line.startswith("## 3."):
            in_messages = True
            continue
        if not in_messages or line.startswith("#") or not line.strip():
            continue
        m = _MSG.match(line)
        if m:
            current = {"n": int(m.group(1)), "files": {}, "content": {}}
            blocks.append(current)
            kind = None
            continue
        if current is None:
            raise SnapshotError("text outside a message block: %r" % line[:60])
        m = _FILE.match(line)
        if m:
            kind = m.group(1)
            if kind not in states.FILES:
                raise SnapshotError("unknown file kind %r" % kind)
            split = int(m.group(2)) if m.group(2) is not None else None
            n = int(m.group(3))
            rel = "%s/%d/%d" % (kind, split, n) if split is not None else "%s/%d" % (kind, n)
            current["files"][kind] = {
                "path": rel, "split": split, "size": int(m.group(4)),
                "mtime": float(m.group(5)), "atime": None, "inode": n,
                "mode": int(m.group(6), 8), "links": int(m.group(7))}
            current["content"][kind] = []
            continue
        if kind is None or not line.startswith("    "):
            raise SnapshotError("unexpected line in msg %d: %r" % (current["n"], line[:60]))
        current["content"][kind].append(line[4:])
    if taken is None or not in_messages:
        raise SnapshotError("not a notqmail queue dump (no 'taken at' line or no section 3)")
    yield header(host, "/var/qmail", "dir", taken, queuelifetime)
    for block in blocks:
        yield _text_block_record(host, block)
    yield trailer(host, len(blocks))


def _text_block_record(host, block):
    n, files, content = block["n"], block["files"], block["content"]
    problems = []
    for kind, meta in files.items():
        if meta["split"] is not None and meta["split"] != layout.split_of(n):
            problems.append("split-mismatch: %s is in split dir %d, expected %d"
                            % (meta["path"], meta["split"], layout.split_of(n)))
    sender, recipients, bounce = None, [], None
    if "info" in content and content["info"]:
        sender = content["info"][0][1:]
    for channel in CHANNELS:
        for rec in content.get(channel, ()):
            recipients.append(recipient(channel, rec[1:], rec[:1] == "D"))
    if "todo" in content and sender is None:
        for rec in content["todo"]:
            if rec[:1] == "F":
                sender = rec[1:]
            elif rec[:1] == "T":
                recipients.append(recipient("todo", rec[1:], False))
    if "bounce" in content:
        bounce = "".join(line[2:] + "\n" for line in content["bounce"])
    return message_record(host, n, "dir", files, sender, recipients, bounce, problems=problems)
