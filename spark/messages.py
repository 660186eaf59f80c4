"""One transition table per message, checked against qmailpy.states (pure Python).

All events of one (host, message number) arrive together, ordered. They are cut
into occurrences (inodes are reused: a message is (host, n, birth), birth being
the time of its `new msg` line) and every event is checked as a move in the
state table:

* each log event kind has its move in states.LOG_EVENT_TRANSITIONS;
* between two logged events a message may only have made moves that other
  programs make without a log line (any maker but LOGGER), and never silently
  reach the state of no message (ABSENT): qmail-send logs `end msg` first;
* after `end msg` the occurrence is closed: only a new `new msg` may follow.

Alongside, the qmailanalog view is kept exactly as matchup(1) builds it, keyed
by number alone: `info msg` (re)starts an entry, `new msg` drops it silently,
a delivery result counts for the entry of its number alive at that moment,
`end msg` emits the m line.

process_group() returns tagged rows:
  ("occ", OCC), ("tr", TRANSITION), ("m", MLINE), ("d", DLINE), ("f", FINDING)
with the field orders of the *_FIELDS tuples below.
"""
import bisect
import math

from qmailpy import states
from qmailpy.retry import SKIP
from qmailpy.states import DEFAULT_QUEUELIFETIME

LOGGER = "qmail-send"          # the program whose log we read: its moves are all logged
ABSENT = next(s for s in states.STATES if not any(states.PRESENCE[s].values()))
EVENT_NAMES = {"new": "new msg", "info": "info msg", "start": "starting delivery",
               "result": "delivery", "bounce": "bounce msg", "triple": "triple bounce",
               "end": "end msg", "hold": "hold msg", "release": "release msg",
               "requeue": "requeue msg", "delete": "delete msg", "bouncenow": "bounce now msg",
               "setaside": "set aside"}
# lines that may be the first of a message qmail-send never preprocessed (docs/qmail-send.md
# "Messages set aside"; a delete by qmailctl while qmail-send is down): it moves S4 -> S1
QUEUED_KINDS = ("setaside", "delete")
BIRTH_MATCH = 2.0              # seconds between a `new msg` line and info/ mtime

# qmail-send's retry schedule (docs/qmail-send.md "Scheduling and retries"; qmailpy/retry.py's SKIP:
# channel -> skip). A pass is due at
# birth + (skip * k)^2 on time, or birth + (isqrt(age at the last pass) + skip)^2
# after an off-schedule pass (ALRM); the first pass after birth + queuelifetime
# is dying: its deferrals are turned into failures and bounced.
RETRY_SKIP = SKIP

OCC_FIELDS = ("host", "n", "birth", "info_time", "bytes", "sender", "qp", "uid", "end_time",
              "ended", "orphan", "attempts", "successes", "failures", "deferrals", "bounced",
              "triple", "last_state")
TRANSITION_FIELDS = ("host", "n", "birth", "seq", "time", "event", "from_state", "via",
                     "to_state", "legal")
MLINE_FIELDS = ("host", "birth", "done", "bytes", "nk", "nd", "nz", "sender", "qp", "uid")
DLINE_FIELDS = ("host", "n", "occ_birth", "result", "birth", "dstart", "ddone", "bytes",
                "sender", "channel", "recipient", "domain", "reason")
FINDING_FIELDS = ("host", "n", "birth", "kind", "severity", "time", "detail")

VIOLATION, NOTICE = "violation", "notice"
FINDING_KINDS = {
    "illegal-transition": VIOLATION,
    "delivery-after-end": VIOLATION,
    "duplicate-delivery": VIOLATION,
    "failure-not-bounced": VIOLATION,
    "past-lifetime": VIOLATION,
    "vanished": VIOLATION,
    "stale-leftover": VIOLATION,
    "files-disagree": VIOLATION,
    "segment-corrupt": VIOLATION,
    "segment-torn": NOTICE,
    "never-ended": NOTICE,
    "unlogged": NOTICE,
    "ended-not-removed": NOTICE,
    "restored-after-damage": NOTICE,
    "set-aside": NOTICE,
}


def id_drops(starts):
    """Seqs where a delivery id is not above the one before it, in (seq, id) order:
    qmail-send numbers deliveries from 1 at every start, so each begins a new run."""
    starts = sorted(starts)
    return [seq for (seq, d), (_, prev) in zip(starts[1:], starts) if d <= prev]


def last_attempt_offset(channel, queuelifetime):
    """Seconds after birth of the first on-time pass that counts as dying."""
    skip = RETRY_SKIP[channel]
    k = int(math.isqrt(queuelifetime) // skip) + 1
    while (skip * (k - 1)) ** 2 > queuelifetime:
        k -= 1
    return (skip * k) ** 2


def next_pass_offset(channel, age):
    """Seconds after birth of the pass that follows one started at age (or earlier)."""
    return (math.isqrt(max(0, int(age))) + RETRY_SKIP[channel]) ** 2


def finding(host, n, birth, kind, when, detail):
    return ("f", (host, n, birth, kind, FINDING_KINDS[kind], when, detail))


def restored_finding(event):
    """The finding for a logparse `restored` event: the log backend brought the message
    back from its last readable record; a recipient may have been delivered twice."""
    host, _, when, _, n, _, seg, off, damage = event
    damage_seg, damage_off = damage.split()
    return finding(host, n, None, "restored-after-damage", when,
                   "state restored from log segment %d offset %d after damage at segment %s "
                   "offset %s" % (seg, off, damage_seg, damage_off))


def set_aside_finding(event):
    """The finding for a logparse `setaside` event: qmail-send could not record the
    message and left it queued, untouched, for the administrator."""
    host, _, when, _, n, _, reason, _, _ = event
    return finding(host, n, None, "set-aside", when, "set aside by qmail-send: %s" % reason)


def _unlogged(edge):
    return states.TRANSITIONS[edge][0] != LOGGER


def _implicit_path(cur, target, silent=_unlogged):
    """States passed through by unrecorded moves from cur to target, or None when impossible.

    silent(edge) says whether a move can happen without leaving a trace in the input.
    """
    if cur == target:
        return []
    if cur == ABSENT:
        return None
    frontier, seen = [(cur, [])], {cur}
    while frontier:
        state, path = frontier.pop(0)
        for (a, b) in states.TRANSITIONS:
            if a != state or not silent((a, b)) or b == ABSENT or b in seen:
                continue
            if b == target:
                return path + [b]
            seen.add(b)
            frontier.append((b, path + [b]))
    return None


def _opening_path(target, silent=_unlogged):
    """Unrecorded moves that bring a new message from ABSENT to target."""
    frontier, seen = [(ABSENT, [])], {ABSENT}
    while frontier:
        state, path = frontier.pop(0)
        if state == target:
            return path
        for (a, b) in states.TRANSITIONS:
            if a == state and silent((a, b)) and b not in seen:
                seen.add(b)
                frontier.append((b, path + [b]))
    return None


def event_move_legal(before, after):
    """The move an event records: one legal move, or a chain of them (end msg)."""
    if before == after:
        return states.is_legal(before, after)
    return states.is_legal(before, after) or states.path_exists(before, after)


class Occurrence:
    __slots__ = ("n", "birth", "info_time", "bytes", "sender", "qp", "uid", "end_time",
                 "state", "orphan", "attempts", "successes", "failures", "deferrals",
                 "bounced", "triple", "succeeded", "lifetime_reported", "superseded",
                 "seen_in", "end_seq", "late", "dying")

    def __init__(self, n, birth, state, orphan):
        self.n, self.birth, self.state, self.orphan = n, birth, state, orphan
        self.info_time = self.bytes = self.sender = self.qp = self.uid = self.end_time = None
        self.attempts = self.successes = self.failures = self.deferrals = 0
        self.bounced = self.triple = 0
        self.succeeded = {}             # (channel, recipient) -> run of its first success
        self.lifetime_reported = False
        self.superseded = False
        self.seen_in = set()
        self.end_seq = None
        self.late = {}          # channel -> dstart of a deferral past its last scheduled pass
        self.dying = {}         # channel -> ddone of its dying pass's first failure

    @property
    def ended(self):
        return self.end_time is not None


class HostContext:
    """What one host's other inputs say: log span and snapshot times."""
    __slots__ = ("log_start", "log_end", "log_end_exiting", "snapshots", "queuelifetime",
                 "lifetime_slack", "restarts")

    def __init__(self, log_start=None, log_end=None, log_end_exiting=False, snapshots=(),
                 queuelifetime=DEFAULT_QUEUELIFETIME, lifetime_slack=3600.0, restarts=()):
        self.log_start, self.log_end, self.log_end_exiting = log_start, log_end, log_end_exiting
        self.snapshots = tuple(snapshots)
        self.queuelifetime, self.lifetime_slack = queuelifetime, lifetime_slack
        self.restarts = tuple(sorted(restarts))     # seqs where qmail-send's delivery ids restart

    def run_of(self, seq):
        """Which start of qmail-send (0, 1, ...) a log line at seq belongs to."""
        return bisect.bisect_right(self.restarts, seq)

    def log_covers(self, when):
        if self.log_end is None or self.log_start is None or when < self.log_start:
            return False
        return self.log_end >= when or self.log_end_exiting


def _sort_items(items):
    """Log events in line order; snapshot observations after the log lines up to their time."""
    log = sorted((i for i in items if i[0] != "snap"), key=lambda i: i[2])
    snaps = sorted((i for i in items if i[0] == "snap"), key=lambda i: i[2])
    out, j = [], 0
    for item in log:
        while j < len(snaps) and item[3] > snaps[j][2]:
            out.append(snaps[j])
            j += 1
        out.append(item)
    out.extend(snaps[j:])
    return out


def process_group(host, n, items, ctx):
    """Tagged rows for all events of one (host, n).

    items: ("ev", event tuple from logparse, seq, time) for log lines,
           ("del", delivery, seq, time) for a result matched with its start:
               delivery = (dstart, d, channel, recipient, letter, reason, start_seq),
           ("snap", obs, taken, None) for a snapshot message record:
               obs = (state, birth, pending recipients).
    """
    out = []
    occs = []
    occ = None

    def transition(o, seq, when, event, before, after, legal, via=()):
        """One row: from_state, then the unlogged states passed (via), then to_state."""
        out.append(("tr", (host, n, o.birth if o else None, seq, when, event, before,
                           ">".join(via), after, legal)))

    def check(o, seq, when, kind):
        """Check one logged event against the table; returns False when illegal."""
        before, after = states.LOG_EVENT_TRANSITIONS[EVENT_NAMES[kind]]
        if kind == "delete" and o.state in states.DELETE_FROM:
            before = o.state                    # a held message may be deleted too
        path = _implicit_path(o.state, before)
        ok = path is not None and event_move_legal(before, after)
        via = [s for s in path or () if s != after]
        transition(o, seq, when, EVENT_NAMES[kind], o.state, after, ok, via)
        if not ok:
            out.append(finding(host, n, o.birth, "illegal-transition", when,
                               "%s in state %s: no legal way to %s" % (EVENT_NAMES[kind],
                                                                       o.state, before)))
        o.state = after
        return ok

    def open_occurrence(seq, when, kind):
        nonlocal occ
        before, after = states.LOG_EVENT_TRANSITIONS[EVENT_NAMES[kind]]
        if kind == "new":
            occ = Occurrence(n, when, ABSENT, False)
            occs.append(occ)
            via = [s for s in _opening_path(before) or () if s != after]
            transition(occ, seq, when, EVENT_NAMES[kind], ABSENT, after,
                       event_move_legal(before, after), via)
            occ.state = after
        else:
            # the log begins inside this message's life: start where the event says
            occ = Occurrence(n, when, before, True)
            occs.append(occ)
            transition(occ, seq, when, EVENT_NAMES[kind], None, after, True)
            occ.state = after

    for item in _sort_items(items):
        tag = item[0]
        if tag == "snap":
            _observe_snapshot(host, n, occs, item, ctx, out, transition)
            continue
        if tag == "del":
            _, dl, seq, when = item
            dstart, _d, channel, recipient, letter, reason, _start_seq = dl
            if occ is None:
                open_occurrence(seq, when, "result")
            elif occ.ended:
                if _start_seq < _end_seq(occ):
                    out.append(finding(host, n, occ.birth, "delivery-after-end", when,
                                       "delivery %d result %s after end msg" % (_d, letter)))
                transition(occ, seq, when, "delivery", occ.state, occ.state, False)
            else:
                check(occ, seq, when, "result")
            _count_result(host, n, occ, dl, when, ctx, out)
            continue
        ev = item[1]
        seq, when, kind = ev[1], ev[2], ev[3]
        if kind == "new":
            if occ is not None and not occ.ended:
                if occ.state == before_of("new") and not occ.attempts:
                    check(occ, seq, when, "new")      # preprocessing redone: same message
                    continue
                check(occ, seq, when, "new")          # reports the illegal move
                occ.superseded = True
            open_occurrence(seq, when, "new")
            continue
        if occ is None:
            open_occurrence(seq, when, kind)
        elif occ.ended and kind in QUEUED_KINDS:
            # a new message on an ended one's number, queued and never preprocessed (no
            # new msg): set aside, or deleted by qmailctl while qmail-send was down
            occ = Occurrence(n, when, states.S4, True)
            occs.append(occ)
            check(occ, seq, when, kind)
            if kind == "delete":
                occ.end_time, occ.end_seq = when, seq
            continue
        elif occ.ended:
            if kind == "start":
                out.append(finding(host, n, occ.birth, "delivery-after-end", when,
                                   "starting delivery %d to %s %s after end msg"
                                   % (ev[5], ev[6], ev[7])))
                transition(occ, seq, when, EVENT_NAMES[kind], occ.state, occ.state, False)
            else:
                out.append(finding(host, n, occ.birth, "illegal-transition", when,
                                   "%s after end msg" % EVENT_NAMES[kind]))
                transition(occ, seq, when, EVENT_NAMES[kind], occ.state, occ.state, False)
            continue
        else:
            check(occ, seq, when, kind)
        if kind == "info":
            occ.info_time, occ.bytes, occ.sender = when, ev[6], ev[7]
            occ.qp, occ.uid = (int(x) for x in ev[8].split())
        elif kind == "start":
            occ.attempts += 1
        elif kind == "bounce":
            occ.bounced += 1
        elif kind == "triple":
            occ.triple += 1
        elif kind == "delete":
            # ended by the operator: its failures and its lifetime are no longer owed
            occ.end_time, occ.end_seq = when, seq
            occ.late.clear()
        elif kind == "end":
            occ.end_time, occ.end_seq = when, seq
            if occ.failures and not (occ.bounced or occ.triple):
                out.append(finding(host, n, occ.birth, "failure-not-bounced", when,
                                   "%d failed recipient(s), ended without bounce msg"
                                   % occ.failures))
            if occ.late and not occ.lifetime_reported:
                _past_lifetime(host, n, occ, when, out, _late_text(occ, ctx)
                               + "; ended without the failure and bounce that expire it")

    for o in occs:
        _close(host, n, o, ctx, out)
    out.extend(_matchup(host, n, items))
    return out


def _end_seq(o):
    return o.end_seq if o.end_seq is not None else float("inf")


def before_of(kind):
    return states.LOG_EVENT_TRANSITIONS[EVENT_NAMES[kind]][0]


def _count_result(host, n, o, dl, when, ctx, out):
    dstart, d, channel, recipient, letter, reason, _start_seq = dl
    if not o.orphan and channel in RETRY_SKIP:
        _check_lifetime(host, n, o, dl, when, ctx, out)
    if letter == "k":
        o.successes += 1
        # qmail delivers each recipient record once per run of qmail-send, so several
        # successes in one run are an envelope naming the address several times; a
        # success after a restart repeats one that an earlier run already made.
        key = (channel, recipient)
        run = ctx.run_of(_start_seq)
        first = o.succeeded.get(key)
        if first is not None and first < run:
            out.append(finding(host, n, o.birth, "duplicate-delivery", when,
                               "%s %s delivered successfully again after qmail-send restarted "
                               "(delivery %d)" % (channel, recipient, d)))
        if first is None:
            o.succeeded[key] = run
    elif letter == "d":
        o.failures += 1
    else:
        o.deferrals += 1


def _check_lifetime(host, n, o, dl, when, ctx, out):
    """queuelifetime as qmail-send applies it (docs/qmail-send.md "Scheduling and retries"; docs/qmail-send.md "Results").

    The first pass after birth + queuelifetime is dying: it makes one last attempt
    and turns a deferral into a failure, which is bounced. So a message may well be
    tried, fail and bounce after its lifetime; what qmail never does is defer it
    past its channel's last scheduled pass and then let it end without that
    failure, or try the channel again after the dying pass. Both are judged with
    lifetime_slack of grace for passes started late (busy channels).
    """
    dstart, d, channel, recipient, letter, _reason, _ss = dl
    slack = ctx.lifetime_slack
    dying_done = o.dying.get(channel)
    if dying_done is not None and dstart > dying_done + slack and not o.lifetime_reported:
        _past_lifetime(host, n, o, when, out,
                       "%s %s tried again (delivery %d) %.0f s after its dying pass failed"
                       % (channel, recipient, d, dstart - dying_done))
    if letter == "d":
        if dying_done is None and dstart > o.birth + ctx.queuelifetime + slack:
            o.dying[channel] = when
        if channel in o.late and dstart > o.late[channel]:
            del o.late[channel]                 # expired as it should: failure, then bounce
    elif letter == "z" and channel not in o.late:
        deadline = o.birth + last_attempt_offset(channel, ctx.queuelifetime) + slack
        if dstart > deadline:
            o.late[channel] = dstart


def _late_text(o, ctx):
    channel, dstart = min(o.late.items(), key=lambda cd: cd[1])
    return ("deferral of %s started %.0f s after birth, past the last scheduled pass at %d s "
            "(queuelifetime %d s)" % (channel, dstart - o.birth,
                                      last_attempt_offset(channel, ctx.queuelifetime),
                                      ctx.queuelifetime))


def _past_lifetime(host, n, o, when, out, what):
    o.lifetime_reported = True
    out.append(finding(host, n, o.birth, "past-lifetime", when, what))


def _observe_snapshot(host, n, occs, item, ctx, out, transition):
    _, obs, taken, _ = item
    state, birth, pending = obs
    if state is None or not states.PRESENCE[state]["info"] or birth is None:
        return
    matching = [o for o in occs if abs(o.birth - birth) <= BIRTH_MATCH]
    occ = matching[-1] if matching else None
    if occ is not None:
        occ.seen_in.add(taken)
        if occ.ended and state == states.S5 and not pending:
            # end msg is logged before info/ goes (docs/queue-format.md "Delivery and completion (S5→S1)"): a qmail-send that died in
            # between leaves the finished message for its next start to remove.
            transition(occ, None, taken, "snapshot", occ.state, occ.state, True)
            out.append(finding(host, n, occ.birth, "ended-not-removed", taken,
                               "snapshot still holds the message, with nothing pending, "
                               "after end msg"))
            return
        path = _implicit_path(occ.state, state)
        legal = path is not None
        transition(occ, None, taken, "snapshot", occ.state, state, legal,
                   [s for s in path or () if s != state])
        if not legal:
            out.append(finding(host, n, occ.birth, "illegal-transition", taken,
                               "snapshot shows the message in %s after %s" % (
                                   state, "end msg" if occ.ended else "state " + occ.state)))
        return
    if ctx.log_covers(birth):
        out.append(finding(host, n, birth, "unlogged", taken,
                           "snapshot holds message %d born %.0f but the log never "
                           "announced it" % (n, birth)))


def _close(host, n, o, ctx, out):
    for taken in ctx.snapshots:
        if not ctx.log_covers(taken) or o.orphan or o.superseded or o.birth >= taken:
            continue
        in_queue = not o.ended or o.end_time > taken
        if in_queue and taken not in o.seen_in:
            out.append(finding(host, n, o.birth, "vanished", taken,
                               "message not ended at %.0f but missing from that snapshot"
                               % taken))
    if not o.ended and o.late and not o.lifetime_reported and ctx.log_end is not None:
        channel, dstart = min(o.late.items(), key=lambda cd: cd[1])
        due = o.birth + next_pass_offset(channel, dstart - o.birth) + ctx.lifetime_slack
        if ctx.log_end > due:
            _past_lifetime(host, n, o, due, out, _late_text(o, ctx)
                           + "; the log runs on to %.0f s after birth without the dying pass"
                           % (ctx.log_end - o.birth))
    if not o.ended and not o.superseded and ctx.log_end is not None:
        out.append(finding(host, n, o.birth, "never-ended", ctx.log_end,
                           "new msg never ended; age %.0f s at the end of the log"
                           % (ctx.log_end - o.birth)))
    out.append(("occ", (host, n, o.birth, o.info_time, o.bytes, o.sender, o.qp, o.uid,
                        o.end_time, o.ended, o.orphan, o.attempts, o.successes, o.failures,
                        o.deferrals, o.bounced, o.triple, o.state)))


def _domain(recipient):
    at = recipient.rfind("@")
    return recipient[at + 1:] if at >= 0 else ""


def _matchup(host, n, items):
    """qmailanalog's m and d lines for this number, exactly as matchup(1) pairs them."""
    rows = []
    entry = None
    occ_birth = None
    for item in sorted((i for i in items if i[0] != "snap"), key=lambda i: i[2]):
        if item[0] == "del":
            _, dl, _seq, ddone = item
            dstart, _d, channel, recipient, letter, reason, _ss = dl
            recip = recipient.lower()
            if entry is not None:
                entry["n" + letter] += 1
                rows.append(("d", (host, n, occ_birth, letter, entry["birth"], dstart, ddone,
                                   entry["bytes"], entry["sender"], channel, recip,
                                   _domain(recip), reason)))
            else:
                rows.append(("d", (host, n, occ_birth if occ_birth is not None else dstart,
                                   letter, dstart, dstart, ddone, 0, "?", channel, recip,
                                   _domain(recip), reason)))
            continue
        ev = item[1]
        kind, when = ev[3], ev[2]
        if kind == "new":
            entry = None
            occ_birth = when
        elif kind == "info":
            if occ_birth is None:
                occ_birth = when
            entry = {"birth": when, "bytes": ev[6], "sender": ev[7].lower(),
                     "qp": int(ev[8].split()[0]), "uid": int(ev[8].split()[1]),
                     "nk": 0, "nd": 0, "nz": 0}
        elif kind == "end" and entry is not None:
            rows.append(("m", (host, entry["birth"], when, entry["bytes"], entry["nk"],
                               entry["nd"], entry["nz"], entry["sender"], entry["qp"],
                               entry["uid"])))
            entry = None
        elif kind not in ("new", "info", "end") and occ_birth is None:
            occ_birth = when
    return rows


def pair_deliveries(events):
    """Match each delivery result with its `starting delivery`, as matchup(1) does.

    events: the start and result events (logparse tuples) of one (host, delivery id),
    in any order. A result belongs to the latest start before it with the same id;
    a start overwritten by a later start of the same id, or never answered, stays
    pending. Returns (paired items keyed (host, n), number of results with no start).
    """
    paired, unmatched = [], 0
    pending = None
    for ev in sorted(events, key=lambda e: e[1]):
        host, seq, when, kind = ev[0], ev[1], ev[2], ev[3]
        if kind == "start":
            pending = ev
            continue
        if pending is None:
            unmatched += 1
            continue
        start = pending
        pending = None
        dl = (start[2], ev[5], start[6], start[7], ev[6], ev[7], start[1])
        paired.append(((host, start[4]), ("del", dl, seq, when)))
    return paired, unmatched
