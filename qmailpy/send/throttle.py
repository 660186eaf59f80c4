"""qmail-send's gate on remote deliveries: per-domain concurrency and rate limits, and delays
(docs/qmail-send.md "Throttling and delays"; the rules are throttlerules.py's).

A pass asks admit() before it starts a delivery. A refused recipient is not a failed
attempt: the pass goes on with the others, and when its job closes the message's
channel is parked here, with the indexes of the held recipients and the retry time
the pass computed, instead of going back to the backend. wake() hands a parked
channel back when one of its holds lifts (a delivery to the domain ended, the rate
window moved, the delay passed); the pass it opens starts only the held recipients.
next_wakeup() is the earliest time a hold lifts by itself, so the loop sleeps until
then and never polls.
"""
import heapq
import itertools
import time
from collections import deque

from qmailpy import logline
from qmailpy.send import metrics

CACHE_MAX = 10000       # domains whose rule lookup is remembered
SWEEP_MIN = 1024        # domain states kept before idle ones are dropped
UNLIMITED = 1 << 30


class DomainState:
    """A domain with a concurrency or rate limit."""
    __slots__ = ("cap", "rate", "inflight", "held", "starts", "waiters", "throttled")

    def __init__(self, cap, rate):
        self.cap, self.rate = cap, rate
        self.inflight = 0
        self.held = 0                   # recipients refused and not passed again yet
        self.starts = deque()           # start times within the rate window
        self.waiters = deque()          # Parked, first come first woken
        self.throttled = False          # logged as throttled, not idle since

    def free(self, now):
        """How many deliveries may start at `now` (time.time())."""
        free = self.cap - self.inflight if self.cap is not None else UNLIMITED
        if self.rate is not None:
            messages, seconds = self.rate
            starts = self.starts
            while starts and starts[0] <= now - seconds:
                starts.popleft()
            free = min(free, messages - len(starts))
        return free

    def idle(self, now):
        """Nothing in flight, held or counted in the rate window: forgetting it changes nothing."""
        if self.inflight or self.held or self.waiters:
            return False
        return self.rate is None or self.free(now) >= self.rate[0]

    def opens(self):
        """When the rate window next lets one start, if only the rate holds it back."""
        if self.rate is None or (self.cap is not None and self.inflight >= self.cap):
            return None
        if len(self.starts) < self.rate[0]:
            return None
        return self.starts[0] + self.rate[1]


class Parked:
    """A message's channel waiting here: only `indexes` are started when it is woken."""
    __slots__ = ("channel", "n", "retry", "holds", "indexes", "woken")

    def __init__(self, channel, n, retry, holds):
        self.channel, self.n, self.retry, self.holds = channel, n, retry, holds
        self.indexes = frozenset(h[0] for h in holds)
        self.woken = False


class Gate:
    def __init__(self, rules, log):
        self.log = log
        self.states = {}                # domain -> DomainState
        self.counted = {}               # delivery number -> DomainState it counts in
        self.parked = {}                # (channel, n) -> Parked
        self.delays = []                # heap of (due, seq, Parked)
        self.waiting = set()            # domains with waiters
        self.seq = itertools.count()
        self.sweep_at = SWEEP_MIN
        self.set_rules(rules)

    def set_rules(self, rules):
        self.rules = rules
        self.active = rules.active
        self.cache = {}
        for domain, st in self.states.items():
            st.cap, st.rate, _ = rules.lookup(domain)

    def _limits(self, domain):
        limits = self.cache.get(domain, False)
        if limits is False:
            if len(self.cache) >= CACHE_MAX:
                self.cache.clear()
            limits = self.rules.lookup(domain)
            if limits == (None, None, None):
                limits = None
            self.cache[domain] = limits
        return limits

    def _state(self, domain, cap, rate):
        st = self.states.get(domain)
        if st is None:
            if len(self.states) >= self.sweep_at:       # a rule for every domain must not grow for ever
                t = time.time()
                for name in [name for name, other in self.states.items() if other.idle(t)]:
                    del self.states[name]
                self.sweep_at = max(SWEEP_MIN, 2 * len(self.states))
            st = self.states[domain] = DomainState(cap, rate)
        return st

    # -- a pass --------------------------------------------------------------
    def admit(self, address, birth, now, limited=True):
        """None: start it now. Else (domain, due): held until `due` (a delay) or, with due
        None, until the domain's limits let it start. Only delays apply unless `limited`
        (the remote channel)."""
        domain = address.rpartition(b"@")[2].lower().decode("utf-8", "surrogateescape")
        limits = self._limits(domain)
        if limits is None:
            return None
        cap, rate, delay = limits
        if delay is not None and now < birth + delay:
            return domain, birth + delay
        if not limited or (cap is None and rate is None):
            return None
        st = self._state(domain, cap, rate)
        if st.free(time.time()) > 0:
            return None
        metrics.throttled_wait("remote")
        st.held += 1
        if not st.throttled:
            st.throttled = True
            if st.cap is not None and st.inflight >= st.cap:
                self.log(logline.throttling(domain, "concurrencydomains", "%d" % st.cap))
            else:
                self.log(logline.throttling(domain, "ratelimits", "%d/%d" % st.rate))
        return domain, None

    def started(self, d, address):
        if not self.states:
            return
        st = self.states.get(address.rpartition(b"@")[2].lower().decode("utf-8", "surrogateescape"))
        if st is None or (st.cap is None and st.rate is None):
            return
        st.inflight += 1
        self.counted[d] = st
        if st.rate is not None:
            st.starts.append(time.time())

    def finished(self, d):
        st = self.counted.pop(d, None)
        if st is not None:
            st.inflight -= 1
            if st.inflight == 0 and st.held == 0:
                st.throttled = False        # idle: the next refusal is news

    def park(self, channel, n, retry, holds):
        """holds: (index, domain, due) of each recipient admit() held back."""
        p = self.parked[(channel, n)] = Parked(channel, n, retry, holds)
        dues = [due for _, _, due in holds if due is not None]
        if dues:
            heapq.heappush(self.delays, (min(dues), next(self.seq), p))
        for domain in {domain for _, domain, due in holds if due is None}:
            st = self.states[domain]
            st.waiters.append(p)
            self.waiting.add(domain)

    def take(self, channel, n):
        """The Parked entry of a pass being opened (None for an ordinary pass); it leaves the gate."""
        p = self.parked.pop((channel, n), None)
        if p is not None:
            for _, domain, due in p.holds:
                if due is None:
                    self.states[domain].held -= 1
        return p

    # -- the loop ------------------------------------------------------------
    def wake(self, now):
        """Parked entries whose hold lifted at `now` (epoch seconds); each is woken once."""
        woken = []
        delays = self.delays
        while delays and delays[0][0] <= now:
            p = heapq.heappop(delays)[2]
            if not p.woken:
                p.woken = True
                woken.append(p)
        if self.waiting:
            t = time.time()
            for domain in list(self.waiting):
                st = self.states[domain]
                free = st.free(t)
                while free > 0 and st.waiters:
                    p = st.waiters.popleft()
                    if not p.woken:
                        p.woken = True
                        woken.append(p)
                        free -= 1
                if not st.waiters:
                    self.waiting.discard(domain)
        return woken

    def next_wakeup(self):
        """Epoch seconds (float) when a hold lifts by itself, or None."""
        times = [self.delays[0][0]] if self.delays else []
        for domain in self.waiting:
            t = self.states[domain].opens()
            if t is not None:
                times.append(t)
        return min(times) if times else None

    def saved(self, now):
        """(n, channel, due) of parked channels for the orderly exit: due now, so a restart
        passes them again and this gate's rules hold them again."""
        return [(p.n, p.channel, now) for p in self.parked.values() if not p.woken]
