"""Byte format of the log backend's segment files (docs/architecture.md "Queue backends", man qmail-log-queue(5)).

A segment starts with a 24-byte header:

    magic b"QMAILLOG" | version u32 | segment number u64 | crc32c of the first 20 bytes u32

followed by records, each

    b"QL" | type u8 | flags u8 | payload length u32 | crc32c u32 | payload

The CRC-32C covers the magic, type, length and payload but NOT the flags byte:
flags hold the garbage mark, which is written in place with one pwrite() when a
later record supersedes this one. Because nothing checks that byte, live and
garbage are two bytes five bits apart ('L' and 'S'), and any other value is read
as live and reported (flag_problem): a damaged flag may cause a repeat delivery,
never a silently hidden message. Integers are little-endian. Every payload
starts with the write time (u32, epoch seconds) and the message number (u64).

A decoder reading a segment reports three outcomes besides records: a torn tail
(an incomplete or unverifiable record at the end of the data: a crashed append,
ignored and reported), and a corrupt record in the middle (a checksum failure
followed by a valid record further on: reported with its byte range so the caller
can quarantine it, never silently dropped).
"""
import struct

from qmailpy.backends.checksum import crc32c, crc32c_python, native_crc32c as _crc32c_native  # noqa: F401
from qmailpy.layout import CHANNELS
from qmailpy.queuelimits import MAX_RECORD_PAYLOAD


VERSION = 2                             # 1: flags 0 live, 1 garbage (one bit flip apart)
SEGMENT_MAGIC = b"QMAILLOG"
SEGMENT_HEADER = struct.Struct("<8sIQI")
HEADER_SIZE = SEGMENT_HEADER.size       # 24
RECORD_MAGIC = b"QL"
RECORD_HEADER = struct.Struct("<2sBBII")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 12
FLAGS_OFFSET = 3                        # of the flags byte inside a record
MAX_PAYLOAD = MAX_RECORD_PAYLOAD         # what qmail-queue accepts fits: qmailpy/queuelimits.py

LIVE, GARBAGE = 0x4C, 0x53             # b"L", b"S" (superseded)

ENVELOPE, PREPROCESSED, START, DELIVERY, BOUNCE_NOTE, REPLACEMENT, FINISH = range(1, 8)
TYPE_NAMES = {ENVELOPE: "ENVELOPE", PREPROCESSED: "PREPROCESSED", START: "START",
              DELIVERY: "DELIVERY", BOUNCE_NOTE: "BOUNCE-NOTE", REPLACEMENT: "REPLACEMENT",
              FINISH: "FINISH"}
SNAPSHOTS = (PREPROCESSED, REPLACEMENT)   # records holding a message's whole S5 state

_CHANNEL_CODE = {"local": 0, "remote": 1}
# Bit 2 of a snapshot's `sched` byte: the message is held (qmailctl queue hold). The
# runners read it from the fixed prefix and never offer a held message.
HELD_BIT = 4

# DELIVERY results and BOUNCE-NOTE operations.
SUCCESS, FAILURE = b"K", b"D"
NOTE_ADD, NOTE_CLEAR = 0, 1

_U8, _U32, _U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
_COMMON = struct.Struct("<IQ")          # time, n
_II = struct.Struct("<II")
_SNAP = struct.Struct("<QIIQ")
_SCHED = struct.Struct("<BQQ")         # channels present, local due, remote due
_DELIV = struct.Struct("<BI")
_POS = struct.Struct("<IQ")             # segment, offset


class RecordError(ValueError):
    """A payload that does not decode (only possible if the CRC matched by accident)."""


# --- positions ----------------------------------------------------------------

NOWHERE = (0, 0)


# --- segment header -----------------------------------------------------------

def segment_header(number):
    head = SEGMENT_MAGIC + struct.pack("<IQ", VERSION, number)
    return head + _U32.pack(crc32c(head))


def parse_segment_header(data):
    """The segment number; RecordError for a bad magic, version or checksum."""
    if len(data) < HEADER_SIZE:
        raise RecordError("segment header truncated")
    magic, version, number, crc = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise RecordError("not a qmailpy log segment")
    if crc != crc32c(data[:20]):
        raise RecordError("segment header checksum mismatch")
    if version != VERSION:
        raise RecordError("segment format version %d not supported" % version)
    return number


# --- payload pieces -----------------------------------------------------------

def _bytes(b):
    return _U32.pack(len(b)) + b


def _list(items):
    return _U32.pack(len(items)) + b"".join(_U32.pack(len(i)) + i for i in items)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data, pos):
        self.data, self.pos = data, pos

    def take(self, st):
        if self.pos + st.size > len(self.data):
            raise RecordError("payload too short")
        value = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return value if len(value) > 1 else value[0]

    def bytes(self):
        size = self.take(_U32)
        if self.pos + size > len(self.data):
            raise RecordError("payload too short")
        value = bytes(self.data[self.pos:self.pos + size])
        self.pos += size
        return value

    def list(self):
        return [self.bytes() for _ in range(self.take(_U32))]


# --- records --------------------------------------------------------------------

class Record:
    """A decoded record. `pos` is (segment, offset); `length` its length in bytes on disk."""
    __slots__ = ("type", "flags", "time", "n", "fields", "pos", "length")

    def __init__(self, type, time, n, fields, flags=LIVE, pos=NOWHERE, length=0):
        self.type, self.time, self.n, self.fields = type, time, n, fields
        self.flags, self.pos, self.length = flags, pos, length

    @property
    def name(self):
        return TYPE_NAMES.get(self.type, str(self.type))

    @property
    def garbage(self):
        return self.flags == GARBAGE

    def __getattr__(self, key):
        try:
            return self.fields[key]
        except KeyError:
            raise AttributeError(key) from None

    def __repr__(self):
        return "Record(%s n=%d at %r %r)" % (self.name, self.n, self.pos, self.fields)

    def __eq__(self, other):
        return (isinstance(other, Record) and (self.type, self.time, self.n, self.fields)
                == (other.type, other.time, other.n, other.fields))


def frame(type, payload, flags=LIVE):
    """The on-disk bytes of one record with this payload."""
    if len(payload) > MAX_PAYLOAD:
        raise RecordError("record payload too large")
    head = RECORD_MAGIC + bytes((type,)) + _U32.pack(len(payload))
    crc = crc32c(payload, crc32c(head))
    return RECORD_HEADER.pack(RECORD_MAGIC, type, flags, len(payload), crc) + payload


def encode_envelope(time, n, uid, qp, sender, recipients):
    return frame(ENVELOPE, _COMMON.pack(time, n) + struct.pack("<II", uid, qp)
                 + _bytes(sender) + _list(recipients))


def encode_snapshot(type, time, n, prev, birth, qp, uid, size, sender, notes, ended, channels,
                    held=False):
    """PREPROCESSED or REPLACEMENT: the whole S5 state of a message.

    channels: {name: (due, [(done, address), ...])}; ended: channel names whose
    delivery pass this record closes; prev: position of the record it supersedes.
    The channels' due times sit at a fixed place right after the common prefix
    (see `schedule`), so queue runners can decide without decoding the rest."""
    present = sum(1 << _CHANNEL_CODE[c] for c in channels) | (HELD_BIT if held else 0)
    dues = [channels[c][0] if c in channels else 0 for c in CHANNELS]
    parts = [_COMMON.pack(time, n), _POS.pack(*prev), _SCHED.pack(present, *dues),
             _SNAP.pack(birth, qp, uid, size), _bytes(sender), _bytes(notes),
             _U8.pack(sum(1 << _CHANNEL_CODE[c] for c in ended))]
    for name in CHANNELS:
        if name not in channels:
            continue
        rcpts = channels[name][1]
        parts.append(_U32.pack(len(rcpts)))
        for done, address in rcpts:
            parts.append(_U8.pack(1 if done else 0) + _bytes(address))
    return frame(type, b"".join(parts))


def encode_start(time, n, snapshot, channel):
    return frame(START, _COMMON.pack(time, n) + _POS.pack(*snapshot)
                 + _U8.pack(_CHANNEL_CODE[channel]))


def encode_delivery(time, n, channel, index, result):
    return frame(DELIVERY, _COMMON.pack(time, n) + struct.pack("<BI", _CHANNEL_CODE[channel], index)
                 + result)


def encode_bounce_note(time, n, op, note=b""):
    return frame(BOUNCE_NOTE, _COMMON.pack(time, n) + _U8.pack(op) + _bytes(note))


def encode_finish(time, n, prev):
    return frame(FINISH, _COMMON.pack(time, n) + _POS.pack(*prev))


def _decode_payload(type, payload):
    r = _Reader(payload, 0)
    time, n = r.take(_COMMON)
    f = {}
    if type == ENVELOPE:
        f["uid"], f["qp"] = r.take(_II)
        f["sender"] = r.bytes()
        f["recipients"] = r.list()
    elif type in SNAPSHOTS:
        f["prev"] = r.take(_POS)
        present, local_due, remote_due = r.take(_SCHED)
        if present & ~(3 | HELD_BIT):
            raise RecordError("unknown channel bits")
        f["held"] = bool(present & HELD_BIT)
        f["birth"], f["qp"], f["uid"], f["size"] = r.take(_SNAP)
        f["sender"] = r.bytes()
        f["notes"] = r.bytes()
        mask = r.take(_U8)
        f["ended"] = tuple(c for c in CHANNELS if mask & (1 << _CHANNEL_CODE[c]))
        channels = {}
        for name, due in zip(CHANNELS, (local_due, remote_due)):
            if not present & (1 << _CHANNEL_CODE[name]):
                continue
            rcpts = []
            for _ in range(r.take(_U32)):
                done = r.take(_U8)
                rcpts.append((bool(done), r.bytes()))
            channels[name] = (due, rcpts)
        f["channels"] = channels
    elif type == START:
        f["snapshot"] = r.take(_POS)
        f["channel"] = _channel(r.take(_U8))
    elif type == DELIVERY:
        code, f["index"] = r.take(_DELIV)
        f["channel"] = _channel(code)
        f["result"] = bytes(payload[r.pos:r.pos + 1])
        if f["result"] not in (SUCCESS, FAILURE):
            raise RecordError("unknown delivery result")
        r.pos += 1
    elif type == BOUNCE_NOTE:
        f["op"] = r.take(_U8)
        f["note"] = r.bytes()
    elif type == FINISH:
        f["prev"] = r.take(_POS)
    else:
        raise RecordError("unknown record type %d" % type)
    if r.pos != len(payload):
        raise RecordError("trailing bytes in payload")
    return Record(type, time, n, f)


def _channel(code):
    if code > 1:
        raise RecordError("unknown channel code %d" % code)
    return CHANNELS[code]


def _frame(data, pos):
    """(type, flags, end) of the checksum-valid record framed at data[pos:], or None."""
    if pos + RECORD_HEADER_SIZE > len(data):
        return None
    magic, type, flags, length, crc = RECORD_HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC or length > MAX_PAYLOAD:
        return None
    end = pos + RECORD_HEADER_SIZE + length
    if end > len(data):
        return None
    if crc32c(data[pos + RECORD_HEADER_SIZE:end], crc32c(data[pos:pos + 3] + data[pos + 4:pos + 8])) != crc:
        return None
    return type, flags, end


def decode_one(data, pos=0):
    """The Record framed at data[pos:], or None if it is incomplete or fails its checksum."""
    framed = _frame(data, pos)
    if framed is None:
        return None
    type, flags, end = framed
    try:
        record = _decode_payload(type, data[pos + RECORD_HEADER_SIZE:end])
    except (RecordError, struct.error):
        return None
    record.flags = flags
    record.length = end - pos
    return record


def frame_length(data, pos=0):
    """Length of the checksum-valid record framed at data[pos:], or None."""
    framed = _frame(data, pos)
    return None if framed is None else framed[2] - pos


_LIGHT = struct.Struct("<2sBBII" "IQ" "IQ" "BQQ")


def schedule(data, pos=0):
    """(type, flags, time, n, {channel: due}) of a valid record, read from its fixed prefix.

    For snapshots the dict holds the channels present; for other types, and for a
    held snapshot (never due), it is None. The caller has checked the record with
    frame_length()."""
    type, flags = data[pos + 2], data[pos + 3]
    if type not in SNAPSHOTS:
        time, n = _COMMON.unpack_from(data, pos + RECORD_HEADER_SIZE)
        return type, flags, time, n, None
    (_, _, _, _, _, time, n, _, _, present, local_due, remote_due) = _LIGHT.unpack_from(data, pos)
    if present & HELD_BIT:
        return type, flags, time, n, None
    dues = {}
    if present & 1:
        dues["local"] = local_due
    if present & 2:
        dues["remote"] = remote_due
    return type, flags, time, n, dues


class Problem:
    """A torn tail or corrupt middle stretch found while decoding a segment,
    or a record whose flags byte is neither LIVE nor GARBAGE (kind FLAG)."""
    __slots__ = ("kind", "segment", "start", "end", "flags")

    def __init__(self, kind, segment, start, end, flags=None):
        self.kind, self.segment, self.start, self.end = kind, segment, start, end
        self.flags = flags

    def __repr__(self):
        return "Problem(%s, segment %d, bytes %d-%d)" % (self.kind, self.segment, self.start, self.end)

    def describe(self):
        if self.kind == TORN:
            return ("log segment %d: torn record at offset %d (%d bytes) ignored"
                    % (self.segment, self.start, self.end - self.start))
        if self.kind == FLAG:
            return ("log segment %d: record at offset %d has a damaged garbage flag 0x%02x; kept as live"
                    % (self.segment, self.start, self.flags))
        return ("log segment %d: corrupt record at offset %d (%d bytes) quarantined"
                % (self.segment, self.start, self.end - self.start))


TORN, CORRUPT, FLAG = "torn", "corrupt", "flag"


def flag_problem(flags, segment, start, length):
    """A FLAG Problem for a record whose flags byte is damaged, else None."""
    if flags == LIVE or flags == GARBAGE:
        return None
    return Problem(FLAG, segment, start, start + length, flags)


def decode(data, segment, start=HEADER_SIZE, final=True):
    """Records and problems of segment bytes from `start`: (records, problems, end).

    `end` is the offset after the last good record. With final=False (the data may
    still be growing) an incomplete last record is not a problem: the caller reads
    again later from `end`. A checksum failure followed by a good record is a
    CORRUPT stretch (quarantine it); one that nothing good follows is a TORN tail.
    """
    records, problems = [], []
    pos = start
    size = len(data)
    while pos < size:
        record = decode_one(data, pos)
        if record is not None:
            record.pos = (segment, pos)
            records.append(record)
            pos += record.length
            continue
        resume = _resync(data, pos + 1)
        if resume is None:
            if final or _looks_complete(data, pos):
                problems.append(Problem(TORN, segment, pos, size))
            break
        problems.append(Problem(CORRUPT, segment, pos, resume))
        pos = resume
    return records, problems, pos


def valid_end(data, start=HEADER_SIZE):
    """The offset just after the last checksum-valid record of segment bytes from
    `start`, read over damaged stretches as decode() does (payloads not decoded)."""
    pos = end = start
    size = len(data)
    while pos < size:
        length = frame_length(data, pos)
        if length is not None:
            pos += length
            end = pos
            continue
        resume = _resync(data, pos + 1)
        if resume is None:
            break
        pos = resume
    return end


def _looks_complete(data, pos):
    """A record header whose declared length fits the data but fails the CRC: not growing."""
    if pos + RECORD_HEADER_SIZE > len(data):
        return False
    magic, _, _, length, _ = RECORD_HEADER.unpack_from(data, pos)
    return magic != RECORD_MAGIC or pos + RECORD_HEADER_SIZE + length <= len(data)


def _resync(data, pos):
    """Offset of the next verifiable record after a bad one, or None."""
    while True:
        pos = data.find(RECORD_MAGIC, pos)
        if pos < 0:
            return None
        if decode_one(data, pos) is not None:
            return pos
        pos += 1
