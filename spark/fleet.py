"""Journeys across a fleet of hosts: hand-offs linked to the messages the peers queued
(pure Python, no Spark; docs/architecture.md "The audit", qmail-audit(8) "FLEET").

A hand-off is a remote delivery that qmail-send logged as a success whose text carries
the peer's answer, as qmail-remote writes it (qmailpy/remote/smtp.py) and qmail-send logs
it with spaces as `_` and newlines as `/`:

  delivery 7: success: 127.0.1.2_accepted_message./Remote_host_said:_250_ok_1795000000_qp_4242/

qmail-smtpd's `250 ok TIME qp PID` (qmailpy/smtpd/session.py) names the pid of the
process that queued the message, which the peer's qmail-send logs in
`info msg N: bytes B from <S> qp PID uid U` (qmailpy/logline.py). That pid is not unique
(a queue worker serves many messages), so a hand-off links to a peer's message when all of:

* the peer is the host MAP names for the address the sender connected to;
* qp equal;
* envelope sender equal;
* the peer's size is the sender's or larger by at most HEADER_GROWTH bytes
  (qmail-smtpd adds its Received: line);
* the peer's `new msg` time within [delivery start - skew, delivery end + skew].

Ambiguity: all (hand-off, candidate) pairs of one (peer, qp) are taken nearest in time
first, each hand-off and each peer message used at most once; a hand-off that had more
than one candidate is counted as ambiguous (summaries.json fleet.ambiguous). Never merged:
a peer message left over that matches a hand-off's earlier, deferred attempt of the same
recipient is a duplicate (the at-least-once window), not a second hop: it must be born
after that attempt's start (on the peer's clock by the pair's observed skew, less
COPY_MARGIN) and before the linked copy, and be as large as the linked copy within
COPY_SIZE_SLACK bytes (the same message through the same peer: only its Received: lines'
digits differ). Its new msg may come long after the attempt: a peer killed after its commit
logs it when it starts again.

A loop is a host met twice on one path from the journey's origin; two hand-offs of one
message to one peer (two recipients there, one qmail-remote each) are two branches, no loop.

Clocks: the skew of a pair (src, dst) is the median, over its linked hand-offs, of dst's
`new msg` time minus src's `delivery` time. The peer queues the message before src reads
the 250, so between synchronised clocks it is a few milliseconds below zero; the median is
taken as how far dst's clock runs ahead of src's. Every time of a journey is brought to its
origin's clock by subtracting the skews along its path: a hop's latency (from the previous
host's `new msg` to this host's) and the end-to-end latency are on one clock, so a peer
whose clock is 4 minutes behind shows the seconds the hand-off took, not -240 s.

QMQP from null clients (mini-qmail, which keeps no log): the hub's qmail-qmqpd logs
`qmqp from ADDRESS qp PID` (qmailpy/logline.py) for each message a TCP client handed it.
Each such line is linked to the hub's message with that qp whose `new msg` is nearest,
within [line - QMQP_BEFORE, line + skew] on the hub's own clock, each message at most
once; the journey starts at the host MAP names for ADDRESS (else at `qmqp:ADDRESS`), as a
hop with no message number (origin_n null), its `left` the line's time. qmail-qmqpd writes
that line after qmail-queue returns, so the hub may log the message's new msg, and even its
delivery, before it: the end-to-end latency counts from the earlier of the two.
"""
import bisect
import re
import statistics

from qmailpy.queuereply import qp_of
from qmailpy_audit.messages import NOTICE, VIOLATION

DEFAULT_SKEW = 300.0           # seconds two hosts' clocks may differ
HEADER_GROWTH = 8192           # bytes a peer may add (Received:, its filters' headers)
COPY_SIZE_SLACK = 64           # bytes two copies of one hand-off on one peer may differ
COPY_MARGIN = 2.0              # seconds a copy's new msg may precede its attempt's start
#                                (the error of the pair's skew estimate: a hop's own delay)
QMQP_BEFORE = 5.0              # seconds qmail-send's new msg may precede qmail-qmqpd's line
FLEET_FINDING_KINDS = {
    "lost-between-hosts": VIOLATION,
    "duplicate-across-hosts": NOTICE,
    "loop": VIOLATION,
    "vanished-in-fleet": VIOLATION,
}
# the success text once qmail-send's `_` and `/` are read back as spaces and newlines
_ACCEPTED = re.compile(r"(?P<partner>\S+) accepted message\.")
_SAID = re.compile(r"Remote host said: 250 ok (?P<time>\d+) qp \d+")


class MapError(ValueError):
    pass


def parse_map(lines, name="MAP"):
    """{address: host} from MAP's lines `name address...` ('#' comments, blank lines)."""
    by_address, hosts = {}, {}
    for number, raw in enumerate(lines, 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = "%s:%d" % (name, number)
        host, addresses = words[0], words[1:]
        if not addresses:
            raise MapError("%s: host %s names no address" % (where, host))
        if host in hosts:
            raise MapError("%s: host %s named twice (also line %d)" % (where, host, hosts[host]))
        hosts[host] = number
        for address in addresses:
            if address in by_address:
                raise MapError("%s: address %s named twice (hosts %s and %s)"
                               % (where, address, by_address[address], host))
            by_address[address] = host
    if not hosts:
        raise MapError("%s: names no host" % name)
    return by_address


def read_map(path):
    try:
        with open(path, encoding="utf-8") as f:
            return parse_map(f.read().splitlines(), path)
    except OSError as e:
        raise MapError("cannot read %s: %s" % (path, e.strerror or e)) from None


def handoff(reason):
    """(peer address, peer TIME, qp) of a remote success's text, or None."""
    text = reason.replace("_", " ").replace("/", "\n")
    accepted = _ACCEPTED.match(text)
    said = _SAID.search(text)
    if not accepted or not said:
        return None
    qp = qp_of(said.group(0).encode())
    return accepted.group("partner"), int(said.group("time")), qp


class Occurrence:
    """One message on one host (a row of messages.parquet) and what became of it."""
    __slots__ = ("key", "host", "n", "birth", "bytes", "sender", "qp", "end_time", "ended",
                 "bounced", "triple", "orphan", "in_snapshot", "local", "outside", "hops", "incoming",
                 "left", "recipients", "qmqp")

    def __init__(self, row, in_snapshot):
        self.host, self.n, self.birth = row["host"], row["n"], row["birth"]
        self.key = (self.host, self.n, self.birth)
        self.bytes, self.sender, self.qp = row["bytes"], row["sender"], row["qp"]
        self.end_time, self.ended, self.bounced = row["end_time"], row["ended"], row["bounced"]
        self.triple, self.orphan = row["triple"], row["orphan"]
        self.in_snapshot = in_snapshot
        self.local = []          # times of local successes
        self.outside = []        # (partner, time) of remote successes outside the fleet
        self.hops = []           # Hop
        self.incoming = None     # the Hop that brought it
        self.left = None         # its last delivery's time
        self.recipients = set()  # addresses of its deliveries given (qmail-audit --where)
        self.qmqp = None         # (client address, time) of the QMQP hand-off that brought it


class Hop:
    __slots__ = ("src", "dst", "peer", "qp", "dstart", "ddone", "recipient", "peer_time",
                 "candidates", "skew")

    def __init__(self, src, peer, qp, dstart, ddone, recipient, peer_time):
        self.src, self.peer, self.qp = src, peer, qp
        self.dstart, self.ddone, self.recipient, self.peer_time = dstart, ddone, recipient, peer_time
        self.dst, self.candidates, self.skew = None, 0, None


def _matches(hop, occ, skew):
    if occ.qp != hop.qp or occ.sender != hop.src.sender:
        return False
    if occ.bytes is None or hop.src.bytes is None:
        return False
    if not 0 <= occ.bytes - hop.src.bytes <= HEADER_GROWTH:
        return False
    return hop.dstart - skew <= occ.birth <= hop.ddone + skew


def _finding(occ, kind, when, detail):
    return (occ.host, occ.n, occ.birth, kind, FLEET_FINDING_KINDS[kind], when, detail)


class Fleet:
    """The linked fleet: journeys, findings, per-pair skew, counts."""

    def __init__(self, address_map, occ_rows, delivery_rows, snapshot_hosts, log_hosts,
                 skew=DEFAULT_SKEW, qmqp_rows=()):
        """qmqp_rows: (host, time, client address, qp) of qmail-qmqpd's `qmqp from` lines."""
        self.address_map, self.skew = address_map, skew
        self.fleet_hosts = set(address_map.values())
        self.findings, self.ambiguous, self.unjudged = [], 0, 0
        self.qmqp_received, self.qmqp_linked = 0, 0
        self.hop_latencies = []     # (src host, dst host, seconds on one clock)
        self.occs = {}
        for row in occ_rows:
            in_snap = row["host"] in snapshot_hosts and not row["ended"]
            occ = Occurrence(row, in_snap)
            self.occs[occ.key] = occ
        self.hops = []
        deferred = {}
        for d in delivery_rows:
            occ = self.occs.get((d["host"], d["n"], d["occ_birth"]))
            if occ is None:
                continue
            if d["recipient"] is not None:
                occ.recipients.add(d["recipient"])
            if d["ddone"] is not None:
                occ.left = max(occ.left or d["ddone"], d["ddone"])
            if d["result"] != "k":
                if d["channel"] == "remote" and d["result"] == "z":
                    deferred.setdefault((occ.key, d["recipient"]), []).append(d)
                continue
            if d["channel"] == "local":
                occ.local.append(d["ddone"])
                continue
            found = handoff(d["reason"] or "")
            if found is None or found[0] not in address_map:
                occ.outside.append((found[0] if found else "?", d["ddone"]))
                continue
            hop = Hop(occ, address_map[found[0]], found[2], d["dstart"], d["ddone"],
                      d["recipient"], found[1])
            occ.hops.append(hop)
            self.hops.append(hop)
        self._link(log_hosts | snapshot_hosts)
        self.offsets = {(p["src"], p["dst"]): p["median"] for p in self.skew_by_pair()}
        self._duplicates(deferred)
        self._link_qmqp(qmqp_rows)
        self.journeys = self._journeys()

    def _link(self, input_hosts):
        by_peer_qp = {}
        for occ in self.occs.values():
            if occ.host in self.fleet_hosts and occ.qp is not None:
                by_peer_qp.setdefault((occ.host, occ.qp), []).append(occ)
        groups = {}
        for hop in self.hops:
            groups.setdefault((hop.peer, hop.qp), []).append(hop)
        for key, hops in groups.items():
            pairs = []
            for hop in hops:
                cands = [o for o in by_peer_qp.get(key, ()) if _matches(hop, o, self.skew)]
                hop.candidates = len(cands)
                pairs += [(abs(o.birth - hop.ddone), hop.ddone, o.birth, hop, o) for o in cands]
            pairs.sort(key=lambda p: p[:3])
            for _gap, _t, _b, hop, occ in pairs:
                if hop.dst is None and occ.incoming is None:
                    hop.dst, occ.incoming = occ, hop
                    hop.skew = occ.birth - hop.ddone
            for hop in hops:
                if hop.candidates > 1:
                    self.ambiguous += 1
                if hop.dst is not None:
                    continue
                if hop.peer not in input_hosts:
                    self.unjudged += 1
                    continue
                self.findings.append(_finding(
                    hop.src, "lost-between-hosts", hop.ddone,
                    "%s handed it to %s (qp %d, for %s, peer's time %d) but %s never queued "
                    "it: no message there with that qp, sender and size within %.0f s"
                    % (hop.src.host, hop.peer, hop.qp, hop.recipient, hop.peer_time, hop.peer,
                       self.skew)))

    def _duplicates(self, deferred):
        # (host, sender): its unlinked messages by birth, and their births (only those
        # born in an attempt's window can be its copies: a bisection, not a scan)
        spare = {}
        for order, occ in enumerate(self.occs.values()):
            if occ.incoming is None and occ.host in self.fleet_hosts and occ.birth is not None:
                spare.setdefault((occ.host, occ.sender), []).append((occ.birth, order, occ))
        births = {}
        for key, found in spare.items():
            found.sort(key=lambda bo: bo[:2])
            births[key] = [b for b, _o, _occ in found]
        for hop in self.hops:
            if hop.dst is None:
                continue
            for d in deferred.get((hop.src.key, hop.recipient), ()):
                key = (hop.peer, hop.src.sender)
                if key not in spare or d["dstart"] is None:
                    continue
                offset = self.offsets.get((hop.src.host, hop.peer), 0.0)
                low = d["dstart"] + offset - COPY_MARGIN
                window = spare[key][bisect.bisect_left(births[key], low):
                                    bisect.bisect_right(births[key], hop.dst.birth)]
                for _b, _o, occ in sorted(window, key=lambda bo: bo[1]):   # in the map's order
                    if occ.incoming is not None or occ.bytes is None or hop.src.bytes is None:
                        continue
                    if not 0 <= occ.bytes - hop.src.bytes <= HEADER_GROWTH:
                        continue
                    if hop.dst.bytes is None or \
                            abs(occ.bytes - hop.dst.bytes) > COPY_SIZE_SLACK:
                        continue
                    if low <= occ.birth <= hop.dst.birth:
                        occ.incoming = hop          # a copy: part of that journey, not a hop
                        self.findings.append(_finding(
                            occ, "duplicate-across-hosts", occ.birth,
                            "%s queued message %d and message %d for one hand-off from %s "
                            "message %d (an attempt it logged as deferred)"
                            % (hop.peer, occ.n, hop.dst.n, hop.src.host, hop.src.n)))

    def _link_qmqp(self, qmqp_rows):
        """Each `qmqp from` line to the hub's message with its qp nearest in time."""
        if not qmqp_rows:
            return
        by_host_qp = {}
        for occ in self.occs.values():
            if occ.qp is not None and occ.incoming is None:
                by_host_qp.setdefault((occ.host, occ.qp), []).append(occ)
        pairs = []
        for index, (host, when, address, qp) in enumerate(qmqp_rows):
            self.qmqp_received += 1
            for occ in by_host_qp.get((host, qp), ()):
                if when - QMQP_BEFORE <= occ.birth <= when + self.skew:
                    pairs.append((abs(occ.birth - when), when, occ.birth, index, address, occ))
        pairs.sort(key=lambda p: p[:4])
        taken = set()
        for _gap, when, _b, index, address, occ in pairs:
            if occ.qmqp is None and index not in taken:
                occ.qmqp = (address, when)
                taken.add(index)
                self.qmqp_linked += 1

    def _journeys(self):
        out = []
        for occ in sorted(self.occs.values(), key=lambda o: (o.birth, o.host, o.n)):
            if occ.incoming is not None:
                continue
            out.append(self._journey(occ))
        return out

    def _journey(self, origin):
        hops, ends, looped, lost = [], [], False, False
        # (occurrence, hosts on its path before it, its clock's offset from the origin's,
        #  the previous host's new msg time on the origin's clock)
        stack, visited = [(origin, (), 0.0, None)], set()
        client = None
        if origin.qmqp is not None:
            address, when = origin.qmqp
            client = self.address_map.get(address, "qmqp:" + address)
            hops.append({"host": client, "n": None, "queued": None, "left": when,
                         "latency": None})
            stack = [(origin, (client,), 0.0, when)]
        start = origin.qmqp[1] if client is not None else origin.birth
        # qmail-qmqpd logs its line after qmail-queue returns, when the hub may have queued
        # and even delivered the message: the hand-off was no later than the hub's new msg
        first = min(start, origin.birth)
        while stack:
            occ, path, offset, before = stack.pop()
            if occ.key in visited:
                continue
            visited.add(occ.key)
            here = occ.birth - offset                   # on the origin's clock
            if before is not None:
                self.hop_latencies.append((path[-1], occ.host, here - before))
            hops.append({"host": occ.host, "n": occ.n, "queued": occ.birth,
                         "left": occ.left if occ.ended else None,
                         "latency": None if before is None else here - before})
            if occ.host in path and not looped:
                looped = True
                self.findings.append(_finding(
                    occ, "loop", occ.birth, "journey from %s message %d passes %s twice"
                    % (origin.host, origin.n, occ.host)))
            found = []
            found += [("delivered", occ.host, t) for t in occ.local]
            found += [("outside", "%s>%s" % (occ.host, partner), t) for partner, t in occ.outside]
            if occ.bounced:
                found.append(("bounced", occ.host, occ.end_time))
            if occ.triple:      # a double bounce discarded, as qmail-send does by design
                found.append(("discarded", occ.host, occ.end_time))
            if occ.orphan:      # its log began inside: earlier deliveries are not in it
                found.append(("before-log", occ.host, None))
            if not occ.ended:
                found.append(("queued" if occ.in_snapshot else "open", occ.host, None))
            for hop in occ.hops:
                if hop.dst is None:
                    lost = True
                    found.append(("lost", "%s>%s" % (occ.host, hop.peer), hop.ddone))
            ends += [(k, w, None if t is None else t - offset) for k, w, t in found]
            stack += [(hop.dst, path + (occ.host,),
                       offset + self.offsets.get((occ.host, hop.dst.host), 0.0), here)
                      for hop in reversed(occ.hops) if hop.dst is not None]
        if not ends:
            self.findings.append(_finding(
                origin, "vanished-in-fleet", origin.end_time or origin.birth,
                "journey from %s message %d ended nowhere: not delivered, bounced or discarded, not "
                "handed outside the fleet, not queued" % (origin.host, origin.n)))
        times = [t for _k, _w, t in ends if t is not None]
        # hosts in the order the message went (depth first), whatever their clocks say
        route = ">".join(h["host"] for h in hops)
        kinds = sorted({k for k, _w, _t in ends})
        return {
            "origin_host": client or origin.host, "origin_n": None if client else origin.n,
            "origin_birth": start,
            "route": route, "hop_count": len(hops) - 1, "hops": hops,
            "ended": ",".join(kinds) if kinds else "nowhere",
            "ended_where": ["%s at %s" % (k, w) for k, w, _t in ends],
            "end_to_end": (max(times) - first) if times and not lost else None,
            "loop": looped, "lost": lost,
        }

    def null_clients(self):
        """The hosts of MAP that QMQP hand-offs came from (they keep no log: no input)."""
        return {j["origin_host"] for j in self.journeys if j["origin_n"] is None}

    def skew_by_pair(self):
        """[{src, dst, links, median, min, max}]: a peer's `new msg` time minus the sender's
        `delivery` time, over linked hand-offs (negative: the peer queued before the 250
        was read, as it must; minutes: the clocks differ)."""
        pairs = {}
        for hop in self.hops:
            if hop.dst is not None:
                pairs.setdefault((hop.src.host, hop.peer), []).append(hop.skew)
        return [{"src": s, "dst": d, "links": len(v), "median": statistics.median(v),
                 "min": min(v), "max": max(v)} for (s, d), v in sorted(pairs.items())]

    def latency_by_pair(self):
        """[{src, dst, hops, p50, p90, p99, max}]: the hops' latencies (one clock) per pair
        of hosts; src is a null client's name for a QMQP hand-off."""
        pairs = {}
        for src, dst, latency in self.hop_latencies:
            pairs.setdefault((src, dst), []).append(latency)
        return [dict(src=s, dst=d, hops=len(v), **percentiles(v))
                for (s, d), v in sorted(pairs.items())]

    def summary(self):
        by_end = {}
        for j in self.journeys:
            by_end[j["ended"]] = by_end.get(j["ended"], 0) + 1
        routes, journeys_by_route = {}, {}
        for j in self.journeys:
            journeys_by_route[j["route"]] = journeys_by_route.get(j["route"], 0) + 1
            if j["end_to_end"] is not None:
                routes.setdefault(j["route"], []).append(j["end_to_end"])
        kinds = {}
        for f in self.findings:
            kinds[f[3]] = kinds.get(f[3], 0) + 1
        return {
            "hosts": sorted(self.fleet_hosts), "skew_tolerance": self.skew,
            "journeys": len(self.journeys),
            "across_hosts": sum(1 for j in self.journeys if j["hop_count"] > 0),
            "handoffs": len(self.hops), "linked": sum(1 for h in self.hops if h.dst),
            "ambiguous": self.ambiguous, "unjudged": self.unjudged,
            "by_end": dict(sorted(by_end.items())),
            "findings": dict(sorted(kinds.items())),
            "skew": self.skew_by_pair(),
            "qmqp": {"received": self.qmqp_received, "linked": self.qmqp_linked,
                     "from_null_clients": sum(1 for j in self.journeys if j["origin_n"] is None
                                              and j["origin_host"] in self.fleet_hosts)},
            "latency_by_pair": self.latency_by_pair(),
            "latency_by_route": [dict(route=r, journeys=count, ended=len(routes.get(r, ())),
                                      **percentiles(routes.get(r, ())))
                                 for r, count in sorted(journeys_by_route.items())],
        }


def percentiles(values):
    """p50, p90, p99 and max of values (None each when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p90": None, "p99": None, "max": None}

    def at(p):
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": ordered[-1]}
