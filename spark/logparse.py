"""qmail-send log lines as the audit's event tuples (pure Python, no Spark).

Every line goes through qmailpy.logline.parse (the one parser). A line becomes
either an event or a bad-input entry:

  event = (host, seq, time, kind, n, d, a, b, c)
    kind    a                 b           c
    new     -                 -           -
    info    bytes             sender      "qp uid"
    start   channel           recipient   -
    result  result letter     reason      -      (k, z, d as in qmailanalog)
    bounce  qp                -           -
    triple  -                 -           -
    end     -                 -           -
    hold, release, requeue, delete   -  -  -      (qmailctl queue: docs/qmail-send.md "Commands")
    bouncenow  reason         -           -
    restored  segment         offset      "segment offset" of the damage
    setaside  reason          -           -      (docs/qmail-send.md "Messages set aside")
  n is the message number (None for results), d the delivery id. `restored` is the
  log backend's "state restored" warning (docs/log-queue.md "Damage"): a finding of
  its own, not a move of the message; so is `setaside`, qmail-send's warning that it
  left a message it cannot record where it is.

seq orders lines: file rank << 40 | line index, so one host's files keep their
order. Status lines, alerts and warnings carry no message and are only counted.
journalctl's own framing lines ('-- No entries --', '-- Boot ID --', '-- Logs
begin at ... --', '-- Reboot --') are counted as ignored: they are not bad input.
"""
import re

from qmailpy import logline

SEQ_SHIFT = 48             # file rank above, line position below
PART_SHIFT = 32            # line position = partition << 32 | index in the partition
RESULT_LETTER = {"success": "k", "deferral": "z", "failure": "d"}
# Leading words of the lines qmail-send writes: a line that starts like one of
# them but does not parse was cut short (truncated), anything else is unknown.
_KNOWN_STARTS = ("status:", "new msg", "info msg", "starting delivery", "delivery ",
                 "bounce msg", "triple bounce", "end msg", "alert:", "warning:",
                 "hold msg", "release msg", "requeue msg", "delete msg", "bounce now msg")
# logline kinds of qmailctl queue's lines -> event kinds
COMMAND_KINDS = {"hold msg": "hold", "release msg": "release", "requeue msg": "requeue",
                 "delete msg": "delete"}
MESSAGE_KINDS = ("new", "info", "start", "bounce", "triple", "end", "bouncenow",
                 "setaside") + tuple(COMMAND_KINDS.values())
_JOURNAL_MARKER = re.compile(r"-- (No entries|Boot [0-9a-f]+|Reboot|Logs begin at .*|"
                             r"Journal begins at .*|Journal started|Journal stopped) --$")


def seq_of(rank, index):
    return (rank << SEQ_SHIFT) | index


def position(index):
    """A line position as people read it."""
    part, line = index >> PART_SHIFT, index & ((1 << PART_SHIFT) - 1)
    return "line %d" % (line + 1) if not part else "split %d line %d" % (part, line + 1)


def _time(line, parsed_time):
    # TAI64N: rebuild the value from the label's digits, the way qmailanalog's
    # matchup prints it, so epoch and TAI64N copies of one log give equal floats.
    if line[:1] == "@" and len(line) > 25:
        try:
            sec = int(line[1:17], 16) - 2 ** 62 - 10
            return float("%d.%09d" % (sec, int(line[17:25], 16)))
        except ValueError:
            return parsed_time
    return parsed_time


def classify_bad(text):
    """'truncated-line' or 'unknown-line' for a line the parser did not recognise."""
    stripped = text.strip()
    for start in _KNOWN_STARTS:
        if stripped.startswith(start.strip()) or (len(stripped) >= 3 and start.startswith(stripped)):
            return "truncated-line"
    return "unknown-line"


def parse_line(host, rank, index, line):
    """(line kind, host, seq, time, event or None) for a good line,
    ("bad", kind, host, rank, index, text) for bad input, ("ignored", kind) for journald's
    framing."""
    if line.startswith("-- ") and _JOURNAL_MARKER.match(line.rstrip()):
        return ("ignored", "journald-marker")
    ev = logline.parse(line)
    kind = ev.kind
    seq = seq_of(rank, index)
    if kind == "unknown":
        bad = "empty-line" if not ev.text.strip() else classify_bad(ev.text)
        return ("bad", bad, host, rank, index, line[:300])
    if ev.time is None:
        return ("bad", "no-timestamp", host, rank, index, line[:300])
    when = _time(line, ev.time)
    host = ev.host or host
    f = ev.fields
    event = None
    if kind == "new msg":
        event = (host, seq, when, "new", f["n"], None, None, None, None)
    elif kind == "info msg":
        event = (host, seq, when, "info", f["n"], None, f["bytes"], f["sender"],
                 "%d %d" % (f["qp"], f["uid"]))
    elif kind == "starting delivery":
        event = (host, seq, when, "start", f["n"], f["d"], f["channel"], f["recipient"], None)
    elif kind == "delivery":
        event = (host, seq, when, "result", None, f["d"], RESULT_LETTER[f["result"]],
                 f["text"], None)
    elif kind == "report mangled":
        event = (host, seq, when, "result", None, f["d"], "z", "report_mangled", None)
    elif kind == "bounce msg":
        event = (host, seq, when, "bounce", f["n"], None, f["qp"], None, None)
    elif kind == "triple bounce":
        event = (host, seq, when, "triple", f["n"], None, None, None, None)
    elif kind == "end msg":
        event = (host, seq, when, "end", f["n"], None, None, None, None)
    elif kind in COMMAND_KINDS:
        event = (host, seq, when, COMMAND_KINDS[kind], f["n"], None, None, None, None)
    elif kind == "bounce now":
        event = (host, seq, when, "bouncenow", f["n"], None, f["text"], None, None)
    elif kind == "set aside":
        event = (host, seq, when, "setaside", f["n"], None, f["text"], None, None)
    elif kind == "state restored":
        event = (host, seq, when, "restored", f["n"], None, f["seg"], f["off"],
                 "%d %d" % (f["damage_seg"], f["damage_off"]))
    return (kind, host, seq, when, event)
