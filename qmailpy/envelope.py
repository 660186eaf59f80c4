"""Byte formats of qmail's queue files and the texts built from addresses.

One definition each (docs/control-files.md "Conventions"; docs/queue-format.md "File formats"): the qmail-queue envelope read on fd 1, the
intd/todo records, info, local/remote channel records, bounce notes, and the
quote()/quote2()/date822()/safe() renderings used in headers and logs.
All values are bytes; addresses are raw bytes without brackets.
"""
import time

MAX_ADDRESS = 1002          # qmail-queue's per-address limit (docs/queue-format.md "Envelope read by qmail-queue on fd 1")

_MONTHS = (b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun",
           b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec")
_WEEKDAYS = (b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun")


class EnvelopeError(ValueError):
    """A malformed envelope; .exit_code is qmail-queue's exit status for it."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


# --- the envelope qmail-queue reads on fd 1 -------------------------------

def queue_envelope(sender, recipients):
    """What an injector writes to qmail-queue's fd 1: F sender NUL (T rcpt NUL)* NUL."""
    parts = [b"F", sender, b"\0"]
    for rcpt in recipients:
        parts += [b"T", rcpt, b"\0"]
    parts.append(b"\0")
    return b"".join(parts)


def parse_queue_envelope(data):
    """(sender, recipients) from a complete fd-1 envelope; EnvelopeError with qmail's exit code."""
    pos = 0
    sender = None
    recipients = []
    first = True
    while True:
        if pos >= len(data):
            raise EnvelopeError("envelope ended before its final NUL", 54)
        kind = data[pos:pos + 1]
        if not first and kind == b"\0":
            if pos + 1 != len(data):
                # qmail stops reading at the final NUL; trailing bytes are ignored.
                pass
            return sender, recipients
        if first and kind != b"F" or not first and kind != b"T":
            raise EnvelopeError("envelope record starts with %r" % kind, 91)
        end = data.find(b"\0", pos + 1)
        if end < 0:
            if len(data) - pos - 1 > MAX_ADDRESS:
                raise EnvelopeError("envelope address too long", 11)
            raise EnvelopeError("envelope ended inside an address", 54)
        addr = data[pos + 1:end]
        if len(addr) > MAX_ADDRESS:
            raise EnvelopeError("envelope address too long", 11)
        if first:
            sender = addr
            first = False
        else:
            recipients.append(addr)
        pos = end + 1


# --- intd/ and todo/ ------------------------------------------------------

def todo_bytes(uid, pid, sender, recipients):
    """intd/n and todo/n: u{uid}\\0 p{pid}\\0 F{sender}\\0 (T{rcpt}\\0)*."""
    parts = [b"u%d\0p%d\0F" % (uid, pid), sender, b"\0"]
    for rcpt in recipients:
        parts += [b"T", rcpt, b"\0"]
    return b"".join(parts)


class Todo:
    """The records of a todo file. Missing u/p read as 0 (docs/queue-format.md "intd/ and todo/")."""

    def __init__(self, uid=0, pid=0, sender=b"", recipients=(), unknown=()):
        self.uid = uid
        self.pid = pid
        self.sender = sender
        self.recipients = list(recipients)
        self.unknown = list(unknown)       # records with another leading letter


def _decimal(value):
    digits = b""
    for ch in value:
        if 48 <= ch <= 57:
            digits += bytes([ch])
        else:
            break
    return int(digits) if digits else 0


def parse_todo(data):
    """A Todo from todo/intd bytes. A final record without NUL is ignored (torn write)."""
    todo = Todo()
    for record in data.split(b"\0")[:-1]:
        kind, value = record[:1], record[1:]
        if kind == b"u":
            todo.uid = _decimal(value)
        elif kind == b"p":
            todo.pid = _decimal(value)
        elif kind == b"F":
            todo.sender = value
        elif kind == b"T":
            todo.recipients.append(value)
        else:
            todo.unknown.append(record)
    return todo


# --- info/ ----------------------------------------------------------------

def info_bytes(sender):
    return b"F" + sender + b"\0"


def parse_info(data):
    """The sender recorded in info/S/n (bytes after F up to the NUL)."""
    if not data.startswith(b"F"):
        raise ValueError("info file does not start with F")
    end = data.find(b"\0")
    return data[1:end] if end >= 0 else data[1:]


# --- local/ and remote/ ---------------------------------------------------

PENDING, DONE = b"T", b"D"


def channel_bytes(recipients):
    return b"".join(b"T" + r + b"\0" for r in recipients)


class ChannelRecord:
    """One recipient of a channel file: its byte offset, done flag and address."""
    __slots__ = ("offset", "done", "address")

    def __init__(self, offset, done, address):
        self.offset = offset
        self.done = done
        self.address = address

    def __repr__(self):
        return "ChannelRecord(%d, %r, %r)" % (self.offset, self.done, self.address)


def parse_channel(data):
    """ChannelRecords of local/remote bytes; unknown record letters raise ValueError."""
    records = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\0", pos)
        if end < 0:
            break                     # torn last record: not a recipient
        kind = data[pos:pos + 1]
        if kind not in (PENDING, DONE):
            raise ValueError("unknown record type %r at offset %d" % (kind, pos))
        records.append(ChannelRecord(pos, kind == DONE, data[pos + 1:end]))
        pos = end + 1
    return records


# --- bounce/ --------------------------------------------------------------

def bounce_note(address, text):
    """One bounce/n entry for a permanently failed recipient (docs/queue-format.md "bounce/n")."""
    block = b"<" + address.replace(b"\n", b"_") + b">:\n" + text
    out = bytearray()
    for i, ch in enumerate(block):
        if ch == 10 and i > 0 and block[i - 1] == 10 and i != len(block) - 1:
            out += b"/"
        else:
            out.append(ch)
    if not out.endswith(b"\n"):
        out += b"\n"
    return bytes(out) + b"\n"


# --- renderings -----------------------------------------------------------

_QUOTE_SPECIALS = frozenset(b'"(),:;<>@[\\]')


def _needs_quote(box):
    if not box or box.startswith(b".") or box.endswith(b".") or b".." in box:
        return True
    for ch in box:
        if ch >= 128 or ch < 33 or ch == 127 or ch in _QUOTE_SPECIALS:
            return True
    return False


def quote(box):
    """A local part as it goes into a header or SMTP command (docs/control-files.md "Conventions")."""
    if not _needs_quote(box):
        return box
    out = bytearray(b'"')
    for ch in box:
        if ch in (13, 10, 34, 92):
            out.append(92)
        out.append(ch)
    out.append(34)
    return bytes(out)


def quote2(addr):
    """quote() the part before the last '@', keep '@domain' verbatim."""
    if not addr:
        return addr
    at = addr.rfind(b"@")
    if at < 0:
        return quote(addr)
    return quote(addr[:at]) + addr[at:]


def date822(when=None):
    """'5 Jan 2024 09:03:07 -0000' in UTC, day not zero-padded, no weekday."""
    t = time.gmtime(time.time() if when is None else when)
    return b"%d %s %d %02d:%02d:%02d -0000" % (
        t.tm_mday, _MONTHS[t.tm_mon - 1], t.tm_year, t.tm_hour, t.tm_min, t.tm_sec)


def ufline_date(when=None):
    """'Mon Jan 05 09:03:07 2024' (asctime with a zero-padded day), UTC."""
    t = time.gmtime(time.time() if when is None else when)
    return b"%s %s %02d %02d:%02d:%02d %d" % (
        _WEEKDAYS[t.tm_wday], _MONTHS[t.tm_mon - 1], t.tm_mday,
        t.tm_hour, t.tm_min, t.tm_sec, t.tm_year)


def safe(text):
    """qmail-send's log rendering: LF -> '/', bytes <33, >126 and '%' -> '_'."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    for ch in text:
        if ch == 10:
            out.append(47)
        elif ch < 33 or ch > 126 or ch == 37:
            out.append(95)
        else:
            out.append(ch)
    return bytes(out)
