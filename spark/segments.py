"""Log-backend segments (queue/log/*.seg): the reader hook and the checks on its records.

The segment format belongs to the log backend; the audit does not parse it
itself. reader() imports the backend's record decoder
(qmailpy.backends.log.records: parse_segment_header + decode) and adapts its
records and problems to SegmentItems:

    kind    a key of states.RECORD_TRANSITIONS, or "TORN" (an incomplete tail)
            or "CORRUPT" (a stretch whose checksum does not hold)
    n       the message number (None for TORN/CORRUPT)
    offset  byte offset in the segment

When this installation has no log backend, segments cannot be read: each
segment input is reported as unreadable and the rest is audited.
"""
from qmailpy import states
from qmailpy_audit.messages import ABSENT, _implicit_path, _opening_path, event_move_legal, finding

READER_MODULE = "qmailpy.backends.log.records"


class SegmentItem:
    __slots__ = ("kind", "n", "offset")

    def __init__(self, kind, n, offset):
        self.kind, self.n, self.offset = kind, n, offset


def reader():
    """read(data) -> [SegmentItem] using the log backend's decoder, or None without one."""
    try:
        from qmailpy.backends.log import records as logrecords
    except ImportError:
        return None

    def read(data):
        number = logrecords.parse_segment_header(data)
        recs, problems, _end = logrecords.decode(data, number)
        items = [SegmentItem(r.name, r.n, r.pos[1]) for r in recs]
        items += [SegmentItem("TORN" if p.kind == logrecords.TORN else "CORRUPT", None, p.start)
                  for p in problems]
        return sorted(items, key=lambda i: i.offset)
    return read


def _shortest(before, after):
    frontier, seen = [(before, [])], {before}
    while frontier:
        state, path = frontier.pop(0)
        if state == after:
            return path
        for (a, b) in states.TRANSITIONS:
            if a == state and b not in seen:
                seen.add(b)
                frontier.append((b, path + [(a, b)]))
    return []


# Moves some record stands for; every other legal move leaves no record. Holds are
# recorded too, though no record kind is named after them: a hold or a release is a
# REPLACEMENT and a hold asked at queueing a PREPROCESSED with the held bit, so a path
# through HELD is never taken silently (it would let a FINISH follow a bare ENVELOPE).
RECORDED = {edge for before, after in states.RECORD_TRANSITIONS.values() if before != after
            for edge in _shortest(before, after)} \
    | {edge for edge in states.TRANSITIONS if states.HELD in edge}


def _unrecorded(edge):
    return edge not in RECORDED


def records(read, host, path, data):
    """((host, n), record) items, findings for torn/corrupt records, as tagged rows."""
    out = []
    try:
        for rec in read(data):
            kind = rec.kind
            if kind == "TORN":
                out.append(finding(host, None, None, "segment-torn", None,
                                   "%s: incomplete record at offset %d" % (path, rec.offset)))
            elif kind == "CORRUPT":
                out.append(finding(host, None, None, "segment-corrupt", None,
                                   "%s: corrupt record at offset %d" % (path, rec.offset)))
            else:
                out.append(("seg", ((host, rec.n), (path, rec.offset, kind))))
    except (ValueError, OSError) as e:   # a bad segment header: bad input, not a crash
        out.append(("bad", ("unreadable-segment", path, str(e))))
    return out


def process_segment_group(host, n, recs):
    """Transition rows and findings for the records of one message, in segment order."""
    out = []
    state = None
    for path, offset, kind in sorted(recs):
        before, after = states.RECORD_TRANSITIONS[kind]
        if state is None:
            path_ok = True      # earlier records may sit in segments already deleted
        elif state == ABSENT:
            path_ok = _opening_path(before, _unrecorded) is not None
        else:
            path_ok = _implicit_path(state, before, _unrecorded) is not None
        legal = path_ok and event_move_legal(before, after)
        out.append(("tr", (host, n, None, offset, None, "record " + kind, state, "", after,
                           legal)))
        if not legal:
            out.append(finding(host, n, None, "illegal-transition", None,
                               "%s at %s offset %d in state %s" % (kind, path, offset, state)))
        state = after
    return out
