"""Synthetic qmail-send logs and queue snapshots with known, counted defects.

Used by the audit's tests and by bench/audit.py. Generate() writes one host's
log (in any of the four timestamp styles) and optionally a snapshot taken just
after the log ends, and returns what an audit must find: line counts,
messages, delivery figures, qmailanalog figures and findings by kind.

Clean messages look like real ones: `new msg`, `info msg`, one `starting
delivery` + result per recipient and attempt (status lines after each),
deferred recipients retried 5 s later, a `bounce msg` when something failed,
then `end msg`. Message numbers are reused (a pool smaller than the number of
messages) only after the previous holder ended.

Besides the defects, generate(expired=N) writes N clean messages that outlive
queuelifetime the way qmail ends them: deferred by a pass that began just
before the lifetime ran out (its delivery started after it: a busy channel),
then failed by the dying pass that follows ("I'm not going to try again"),
bounced and ended. Half get the dying pass on schedule, half long after it
(qmail-send was down). None of this is a finding.
"""
import heapq
import random
import time

from qmailpy import snapshot_format, states
from qmailpy.layout import SPLIT
from qmailpy_audit.messages import last_attempt_offset, next_pass_offset

LOG_DEFECTS = ("illegal-transition", "delivery-after-end", "duplicate-delivery",
               "failure-not-bounced", "past-lifetime", "never-ended", "vanished")
SNAPSHOT_DEFECTS = ("snapshot-illegal", "unlogged", "stale-leftover", "files-disagree",
                    "snapshot-past-lifetime")
REMOTE_DOMAINS = ("example.com", "example.net", "example.org", "mail.example", "slow.example")
LOCAL_DOMAIN = "local.example"
SPACING = 0.5           # seconds between births
RETRY = 5.0             # a deferred recipient is retried this much later
LIFETIME = 10           # queuelifetime the defects are built around (tests pass it)
SLACK = 1.0
LONG_LIVED = ("never-ended", "vanished", "past-lifetime", "expired-bounced")
DYING_TEXT = "I'm_not_going_to_try_again;_this_message_has_been_in_the_queue_too_long./"


def prefix(style, when, host):
    sec = int(when)
    usec = int(round((when - sec) * 1e6))
    if usec == 1000000:
        sec, usec = sec + 1, 0
    if style == "epoch":
        return "%d.%06d " % (sec, usec)
    if style == "tai64n":
        return "@%016x%08x " % (2 ** 62 + 10 + sec, usec * 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    if style == "iso":
        return "%s.%06dZ " % (stamp, usec)
    if style == "journald":
        return "%s.%06d+0000 %s qmail-send[812]: " % (stamp, usec, host)
    raise ValueError("unknown timestamp style %r" % style)


def rounded(when):
    """The time a line carries once printed with microseconds."""
    sec = int(when)
    usec = int(round((when - sec) * 1e6))
    return float("%d.%06d" % (sec, usec)) if usec < 1000000 else float(sec + 1)


class Expect:
    def __init__(self):
        self.lines = {}
        self.messages = 0
        self.numbers = set()
        self.ended = 0
        self.bounces = 0
        self.attempts = {"k": 0, "d": 0, "z": 0}
        self.findings = {}
        self.m = []          # (birth, done, bytes, nk, nd, nz)
        self.d = []          # (result, birth, dstart, ddone)
        self.handoffs = []   # (time, size on the peer, sender, peer's qp) handed to a peer

    def line(self, kind):
        self.lines[kind] = self.lines.get(kind, 0) + 1

    def finding(self, kind, count=1):
        self.findings[kind] = self.findings.get(kind, 0) + count

    def qmailanalog(self):
        out = {"completed_messages": len(self.m), "delivery_attempts": len(self.d)}
        if self.m:
            out["recipients"] = sum(nk + nd for _b, _d, _s, nk, nd, _z in self.m)
            out["attempts_for_completed"] = sum(nk + nd + nz for _b, _d, _s, nk, nd, nz in self.m)
            out["bytes"] = sum(s for _b, _d, s, _k, _n, _z in self.m)
            out["bytes_weighted_by_success"] = sum(s * nk for _b, _d, s, nk, _n, _z in self.m)
            out["qtime_total"] = sum(d - b for b, d, _s, _k, _n, _z in self.m)
        if self.d:
            out["success"] = sum(1 for r in self.d if r[0] == "k")
            out["failure"] = sum(1 for r in self.d if r[0] == "d")
            out["deferral"] = len(self.d) - out["success"] - out["failure"]
            out["ddelay_total"] = sum(dd - b for r, b, _s, dd in self.d if r == "k")
            out["xdelay_total"] = sum(dd - s for _r, _b, s, dd in self.d)
        return out


class _Writer:
    def __init__(self, out, style, host, expect):
        self.out, self.style, self.host, self.expect = out, style, host, expect
        self.heap = []
        self.counter = 0

    def add(self, when, kind, text):
        self.counter += 1
        heapq.heappush(self.heap, (when, self.counter, kind, text))

    def flush(self, before=None):
        heap, out = self.heap, self.out
        while heap and (before is None or heap[0][0] < before):
            when, _c, kind, text = heapq.heappop(heap)
            out.write(prefix(self.style, when, self.host) + text + "\n")
            self.expect.line(kind)


def generate(log_path, messages=200, seed=1, style="epoch", host="mx1", start=1795000000.0,
             defects=None, snapshot_path=None, pool=None, expired=0, relay=None):
    """Write a log (and a snapshot); return the Expect of what an audit must find.

    defects: kind -> how many (LOG_DEFECTS and, with a snapshot, SNAPSHOT_DEFECTS).
    expired: how many clean messages expire and bounce (audit with LIFETIME, SLACK).
    relay: a Relay: this host hands some remote successes to a peer and queues the
    messages handed to it (generate_fleet); expect.handoffs lists what it handed on.
    """
    rng = random.Random(seed)
    defects = dict(defects or {})
    expect = Expect()
    pool = pool or max(60, messages // 4)
    base_n = 100000
    plan = {}
    special = [k for k in LOG_DEFECTS for _ in range(defects.get(k, 0))]
    special += ["expired-bounced"] * expired
    if len(special) * 3 > messages:
        raise ValueError("too many defects for %d messages" % messages)
    slots = rng.sample(range(messages // 10, messages - 5), len(special)) if special else []
    for slot, kind in zip(slots, special):
        plan[slot] = kind
    pending = []            # never-ended messages: (n, birth, recipients left)
    ended_in_log = []       # (n, birth) of clean ended messages, for snapshot defects
    delivery = [0]
    busy = {"local": 0, "remote": 0}
    latest = [start]
    expired_seen = 0
    with open(log_path, "w", encoding="utf-8") as out:
        w = _Writer(out, style, host, expect)
        w.add(start - 1, "status", "status: local 0/10 remote 0/20")

        def status(when):
            w.add(when, "status", "status: local %d/10 remote %d/20"
                  % (busy["local"] % 11, busy["remote"] % 21))

        def attempt(n, when, channel, rcpt, result, reason, entry=True, info_birth=None,
                    size=0):
            delivery[0] += 1
            d = delivery[0]
            w.add(when, "starting delivery", "starting delivery %d: msg %d to %s %s"
                  % (d, n, channel, rcpt))
            status(when + 0.000001)
            done = when + 0.0005 + rng.random() * 0.01
            word = {"k": "success", "d": "failure", "z": "deferral"}[result]
            w.add(done, "delivery", "delivery %d: %s: %s" % (d, word, reason))
            status(done + 0.000001)
            expect.attempts[result] += 1
            expect.d.append((result, rounded(info_birth) if entry else rounded(when),
                             rounded(when), rounded(done)))
            latest[0] = max(latest[0], done)
            return done

        for i in range(messages):
            birth = start + i * SPACING
            w.flush(before=birth)
            kind = plan.get(i)
            # a message left queued keeps its number: give it one outside the pool
            n = 800000 + i if kind in LONG_LIVED else base_n + (i % pool)
            expect.messages += 1
            expect.numbers.add(n)
            size = rng.randint(300, 30000)
            sender = "user%d@sender%d.example" % (rng.randint(0, 20), rng.randint(0, 4))
            qp = 4000 + i
            if relay is not None and kind is None and relay.incoming and \
                    relay.incoming[0][0] <= birth:
                _when, size, sender, qp = relay.incoming.pop(0)    # queued from a peer
            w.add(birth, "new msg", "new msg %d" % n)
            info_at = birth + 0.00002
            w.add(info_at, "info msg", "info msg %d: bytes %d from <%s> qp %d uid 1000"
                  % (n, size, sender, qp))
            rcpts = []
            for j in range(rng.choice((1, 1, 1, 2, 3))):
                if rng.random() < 0.4:
                    rcpt = ("local", "u%d.%d@%s" % (rng.randint(0, 50), j, LOCAL_DOMAIN))
                else:
                    rcpt = ("remote", "r%d.%d@%s" % (rng.randint(0, 500), j,
                                                     rng.choice(REMOTE_DOMAINS)))
                rcpts.append(rcpt)
            if kind == "duplicate-delivery":
                rcpts = [rcpts[0], rcpts[0]]
            outcomes = []
            for _ in rcpts:
                x = rng.random()
                outcomes.append("k" if x < 0.85 else "d" if x < 0.9 else "zk")
            if kind == "duplicate-delivery":
                outcomes = ["k", "k"]
            if kind == "failure-not-bounced":
                outcomes[0] = "d"
            if kind == "past-lifetime":
                outcomes = ["zzk"] + outcomes[1:]
            if kind == "expired-bounced":
                outcomes = ["zzd"] + outcomes[1:]
                expired_seen += 1
            nk = nd = nz = 0
            last = info_at
            t = birth + 0.001
            for first, ((channel, rcpt), outcome) in enumerate(zip(rcpts, outcomes)):
                first = first == 0
                at = t
                dying = birth + last_attempt_offset(channel, LIFETIME)    # on-time dying pass
                for step, result in enumerate(outcome):
                    if step and kind == "past-lifetime" and first:
                        # deferred past the dying pass, then delivered at the pass after
                        at = dying + SLACK + 20 if step == 1 else \
                            birth + next_pass_offset(channel, at - birth)
                    elif step and kind == "expired-bounced" and first:
                        at = birth + LIFETIME + SLACK + 2 if step == 1 else \
                            birth + next_pass_offset(channel, LIFETIME - 1) \
                            + (0 if expired_seen % 2 else 1000)
                    elif step:
                        at = birth + RETRY * step
                    reason = {"k": "did_1+0+0/" if channel == "local" else
                              "127.0.0.1_accepted_message./Remote_host_said:_250_ok/",
                              "d": "Sorry,_no_mailbox_here_by_that_name._(#5.1.1)/",
                              "z": "Sorry,_I_wasn't_able_to_establish_an_SMTP_connection."
                                   "_(#4.4.1)/"}[result]
                    if kind == "expired-bounced" and first and step == 2:
                        reason = DYING_TEXT
                    if kind in ("never-ended", "vanished") and step:
                        break
                    if kind == "duplicate-delivery" and not first:
                        # qmail-send restarted after the first success: ids begin at 1
                        delivery[0] = 0
                        at = last + 0.001
                    handed = relay is not None and kind is None and result == "k" and \
                        channel == "remote" and at < relay.until and rng.random() < relay.share
                    if handed:
                        relay.qp += 1
                        reason = "%s_accepted_message./Remote_host_said:_250_ok_%d_qp_%d/" % (
                            relay.peer, int(at), relay.qp)
                    done = attempt(n, at, channel, rcpt, result, reason, info_birth=info_at)
                    if handed:
                        expect.handoffs.append((done, size + 100, sender, relay.qp))
                    last = max(last, done)
                    nk += result == "k"
                    nd += result == "d"
                    nz += result == "z"
                t += 0.0001
            if kind in ("never-ended", "vanished"):
                expect.finding("never-ended")
                if kind == "vanished":
                    if snapshot_path:
                        expect.finding("vanished")
                else:
                    pending.append((n, birth, rcpts))
                continue
            end_at = last + 0.001
            if nd and kind != "failure-not-bounced":
                w.add(end_at, "bounce msg", "bounce msg %d qp %d" % (n, 90000 + i))
                expect.bounces += 1
                end_at += 0.0001
            w.add(end_at, "end msg", "end msg %d" % n)
            latest[0] = max(latest[0], end_at)
            expect.ended += 1
            expect.m.append((rounded(info_at), rounded(end_at), size, nk, nd, nz))
            if kind == "failure-not-bounced":
                expect.finding("failure-not-bounced")
            elif kind == "duplicate-delivery":
                expect.finding("duplicate-delivery")
            elif kind == "past-lifetime":
                expect.finding("past-lifetime")
            elif kind == "illegal-transition":
                w.add(end_at + 0.0001, "end msg", "end msg %d" % n)
                expect.finding("illegal-transition")
            elif kind == "delivery-after-end":
                attempt(n, end_at + 0.001, "remote", "late@example.com", "k",
                        "127.0.0.1_accepted_message./", entry=False)
                expect.finding("delivery-after-end")
            elif kind is None:
                ended_in_log.append((n, rounded(birth)))
        if relay is not None and relay.incoming:
            raise ValueError("%s never queued %d messages handed to it (the generator's "
                             "hand-offs outran the peer's messages)" % (host, len(relay.incoming)))
        last_time = max(start + messages * SPACING, latest[0]) + 30
        w.flush()
        w.add(last_time, "exiting", "status: exiting")
        w.flush()
    expect.pending = pending
    if snapshot_path:
        _snapshot(snapshot_path, host, last_time + 1, pending, ended_in_log, defects, expect,
                  start, rng)
    return expect


def _snapshot(path, host, taken, pending, ended, defects, expect, start, rng):
    records = [snapshot_format.header(host, "/var/qmail", "dir", taken, states.DEFAULT_QUEUELIFETIME)]

    def files(n, kinds, mtime, atime=None, split=None):
        out = {}
        for kind in kinds:
            s = (n % SPLIT) if split is None or kind not in ("info",) else split
            rel = "%s/%d/%d" % (kind, s, n) if kind in ("mess", "info", "local", "remote") \
                else "%s/%d" % (kind, n)
            out[kind] = {"path": rel, "split": s if kind in ("mess", "info", "local", "remote")
                         else None, "size": 100, "mtime": mtime,
                         "atime": atime if atime is not None else mtime, "inode": n,
                         "mode": 0o600, "links": 1}
        return out

    for n, birth, rcpts in pending:
        channels = sorted({c for c, _ in rcpts})
        recs = [snapshot_format.recipient(c, a, False) for c, a in rcpts]
        records.append(snapshot_format.message_record(
            host, n, "dir", files(n, ["mess", "info"] + channels, float(int(birth))),
            "someone@example.org", recs))
    for i in range(defects.get("snapshot-illegal", 0)):
        n, birth = ended[-1 - i]     # the last holder of its number
        records.append(snapshot_format.message_record(
            host, n, "dir", files(n, ["mess", "info", "remote"], float(int(birth))),
            "someone@example.org", [snapshot_format.recipient("remote", "x@example.com", False)]))
        expect.finding("illegal-transition")
    for i in range(defects.get("unlogged", 0)):
        n = 900000 + i
        birth = float(int(start + 20 + i))
        records.append(snapshot_format.message_record(
            host, n, "dir", files(n, ["mess", "info", "remote"], birth), "a@example.org",
            [snapshot_format.recipient("remote", "y@example.com", False)]))
        expect.finding("unlogged")
    for i in range(defects.get("stale-leftover", 0)):
        n = 910000 + i
        old = taken - 200000
        kinds = ["mess"] if i % 2 == 0 else ["mess", "intd"]
        records.append(snapshot_format.message_record(host, n, "dir", files(n, kinds, old, old)))
        expect.finding("stale-leftover")
    for i in range(defects.get("files-disagree", 0)):
        n = 920000 + i
        if i % 3 == 0:                       # todo without mess: no state fits
            rec = snapshot_format.message_record(host, n, "dir", files(n, ["todo"], taken - 5),
                                                 "a@example.org")
        elif i % 3 == 1:                     # info in the wrong split directory
            fs = files(n, ["mess", "info", "remote"], start - 1000, split=(n + 1) % SPLIT)
            rec = snapshot_format.message_record(
                host, n, "dir", fs, "a@example.org",
                [snapshot_format.recipient("remote", "z@example.com", False)],
                problems=["split-mismatch: %s is in split dir %d, expected %d"
                          % (fs["info"]["path"], (n + 1) % SPLIT, n % SPLIT)])
        else:                                # mess and bounce but also todo: no state
            rec = snapshot_format.message_record(host, n, "dir",
                                                 files(n, ["mess", "todo", "bounce"], taken - 5))
        records.append(rec)
        expect.finding("files-disagree")
    for i in range(defects.get("snapshot-past-lifetime", 0)):
        n = 930000 + i
        birth = taken - 8 * 86400
        records.append(snapshot_format.message_record(
            host, n, "dir", files(n, ["mess", "info", "remote"], birth), "old@example.org",
            [snapshot_format.recipient("remote", "w@example.com", False)]))
        expect.finding("past-lifetime")
    count = len(records) - 1
    records.append(snapshot_format.trailer(host, count))
    with open(path, "w", encoding="utf-8") as out:
        snapshot_format.write(records, out)


class Relay:
    """One host's hand-offs in a generated fleet: to `peer` (an address) with the peer's qp
    numbers from `qp` up, until `until` (the peer queues each at its next message's birth, so
    none later than its last ones), and the messages handed to it, (time, size, sender, qp) in
    time order."""

    def __init__(self, peer, share, incoming, qp, until):
        self.peer, self.share, self.incoming, self.qp = peer, share, sorted(incoming), qp
        self.until = until


def generate_fleet(directory, hosts=20, messages=1000, seed=1, style="tai64n", share=0.3):
    """Logs of `hosts` hosts (DIRECTORY/hN/current) in a chain: host i hands about `share`
    of its remote successes to host i+1 at 127.0.1.(i+2), which queues them (same sender,
    size grown by its Received: line, the qp its answer named). Returns (fleet map text,
    [Expect]); the map names each host and its address for qmail-audit --fleet. What an audit
    must find: no finding (every hand-off queued once by its peer, no host twice on a path),
    sum(len(e.handoffs)) hand-offs, all linked."""
    import os
    expects, incoming, lines = [], [], []
    start = 1795000000.0
    # hand-offs stop this long before the peer's last birth: room for a backlog of them
    until = start + (messages - max(20, messages // 10)) * SPACING
    for i in range(hosts):
        name = "h%d" % (i + 1)
        os.makedirs(os.path.join(directory, name), exist_ok=True)
        peer = "127.0.1.%d" % (i + 2) if i + 1 < hosts else None
        relay = Relay(peer, share if peer else 0.0, incoming, 10000 * (i + 2), until)
        expect = generate(os.path.join(directory, name, "current"), messages=messages,
                          seed=seed + i, style=style, host=name, relay=relay, start=start)
        expects.append(expect)
        incoming = expect.handoffs
        lines.append("%s 127.0.1.%d" % (name, i + 1))
    return "\n".join(lines) + "\n", expects
