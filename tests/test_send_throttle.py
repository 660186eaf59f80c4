"""qmail-send's per-domain rules (docs/qmail-send.md "Throttling and delays"): control/concurrencydomains,
control/ratelimits and control/delaydomains, against the real daemons, remote deliveries going through
qmail-rspawn and qmail-remote to an aiosmtpd peer on 127.0.0.1, counted from qmail-send's log."""
import calendar
import os
import re
import time

import psutil
import pytest
from inotify_simple import INotify, flags

from delivery_support import wait_maildir
from lspawn_harness import LocalUsers
from qmailpy.send import metrics
from queue_view import schedule
from remote_harness import Smtpd
from send_harness import Daemons

MSG = b"Subject: throttled\n\nbody\n"
START = re.compile(r"^starting delivery (\d+): msg (\d+) to (local|remote) \S*@(\S+)$")
RESULT = re.compile(r"^delivery (\d+): (success|deferral|failure): ")
JITTER = 0.15           # seconds between a line's write and its log writer's stamp, at most


@pytest.fixture
def smtpd():
    with Smtpd() as server:
        yield server


@pytest.fixture
def daemons(qmail_home, smtpd):
    routes = "".join("%s:127.0.0.1:%d\n" % (d, smtpd.port)
                     for d in ("slow.example", "fast.example", "rate.example"))
    qmail_home.control("smtproutes", routes)
    d = Daemons(qmail_home)
    yield d
    d.kill()


def queue(home, recipients, sender=b"joe@test.example"):
    done = home.queue_message(MSG, sender, recipients)
    assert done.returncode == 0, done.stderr


def in_flight_peaks(lines):
    """{domain: most deliveries in flight at once}, from the starting/result lines."""
    domain_of, now, peak = {}, {}, {}
    for line in lines:
        m = START.match(line)
        if m:
            domain = m.group(4)
            domain_of[m.group(1)] = domain
            now[domain] = now.get(domain, 0) + 1
            peak[domain] = max(peak.get(domain, 0), now[domain])
            continue
        m = RESULT.match(line)
        if m and m.group(1) in domain_of:
            now[domain_of[m.group(1)]] -= 1
    return peak


@pytest.mark.slow
@pytest.mark.both_backends
def test_concurrency_cap_of_one_and_other_domains_not_slowed(qmail_home, smtpd, daemons):
    smtpd.data_delay = 0.4
    qmail_home.control("concurrencydomains", "slow.example:1\nno colon here\nfast.example:0\n"
                       ".example:many\n")
    daemons.start()
    daemons.wait_started()
    queue(qmail_home, [b"a%d@slow.example" % i for i in range(4)] + [b"b%d@fast.example" % i for i in range(4)])
    queue(qmail_home, [b"c@slow.example"])
    lines = daemons.wait_line(r"^end msg ", 2)
    assert in_flight_peaks(lines) == {"slow.example": 1, "fast.example": 4}
    assert sum(1 for l in lines if re.match(r"^delivery \d+: success: ", l)) == 9
    assert not [l for l in lines if re.match(r"^delivery \d+: (deferral|failure)", l)]
    assert [l for l in lines if l.startswith("throttling ")] == [
        "throttling slow.example: control/concurrencydomains limit 1 reached"]
    assert [l for l in lines if l.startswith("warning: ")] == [
        "warning: control/concurrencydomains: ignoring line 'no colon here': want domain:a count of 1 or more",
        "warning: control/concurrencydomains: ignoring line 'fast.example:0': want domain:a count of 1 or more",
        "warning: control/concurrencydomains: ignoring line '.example:many': want domain:a count of 1 or more"]
    assert sorted(r for t in smtpd.transactions for r in t.rcpt_tos) == sorted(
        ["a%d@slow.example" % i for i in range(4)] + ["b%d@fast.example" % i for i in range(4)]
        + ["c@slow.example"])
    assert daemons.stop() == 0                  # qmail-send writes its metrics at exit
    with open(os.path.join(qmail_home.path, "metrics", "qmail.prom")) as f:
        held = metrics.parse(f.read())['qmail_throttled_waits_total{channel="remote"}']
    assert held >= 3                            # a1..a3 at least once each


def stamped_log(home, pattern, count, timeout=60):
    """[(epoch seconds, line)] of qmailctl start's qmail-send log (each line stamped by its log
    writer, qmailpy/ctl/logwriter.py) once `count` lines match `pattern` (inotify on log/)."""
    path = os.path.join(home.path, "log", "qmail-send.log")
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    with INotify() as ino:
        ino.add_watch(os.path.dirname(path), flags.MODIFY | flags.CREATE)
        while True:
            lines = []
            if os.path.exists(path):
                with open(path) as f:
                    for line in f.read().splitlines():
                        stamp, _, text = line.partition(" ")
                        seconds = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
                        lines.append((seconds + float(stamp[19:-1]), text))
            if sum(1 for _, text in lines if regex.search(text)) >= count:
                return lines
            left = deadline - time.monotonic()
            assert left > 0, "timed out waiting for %d x %r; log:\n%s" % (
                count, pattern, "\n".join(text for _, text in lines[-40:]))
            ino.read(timeout=int(min(left, 1.0) * 1000))


@pytest.mark.slow
@pytest.mark.both_backends
def test_rate_limit_counted_per_interval(qmail_home, smtpd):
    """control/ratelimits rate.example:2/1 under qmailctl start: in the log's own stamps, no
    second-long window holds more than two starts to the domain, the eight deliveries (four
    in one message, four alone) take the four intervals they need and no more than a few
    seconds beyond (a throttled delivery waits; a deferral would wait minutes), and a
    domain without a rule is not held behind them."""
    qmail_home.control("smtproutes", "".join("%s:127.0.0.1:%d\n" % (d, smtpd.port)
                                             for d in ("rate.example", "fast.example")))
    qmail_home.control("ratelimits", "rate.example:2/1\nrate.example:2/\n")
    start = qmail_home.run(["qmailctl", "start", "--home", qmail_home.path])
    assert start.returncode == 0, start.stderr
    try:
        stamped_log(qmail_home, r"^status: local", 1)
        queue(qmail_home, [b"r%d@rate.example" % i for i in range(4)] + [b"f@fast.example"])
        for i in range(4, 8):
            queue(qmail_home, [b"r%d@rate.example" % i])
        lines = stamped_log(qmail_home, r"^end msg ", 5)
    finally:
        stop = qmail_home.run(["qmailctl", "stop", "--home", qmail_home.path])
    assert stop.returncode == 0, stop.stderr
    starts = sorted(t for t, text in lines if START.match(text) and START.match(text).group(4) == "rate.example")
    assert len(starts) == 8
    # starts in each interval [t, t + 1 s) opened by a start, less the stamps' jitter
    per_interval = [sum(1 for u in starts if t <= u < t + 1 - JITTER) for t in starts]
    assert max(per_interval) == 2, per_interval
    assert 3 - JITTER < starts[-1] - starts[0] < 3 + 5, starts
    fast = [t for t, text in lines if START.match(text) and START.match(text).group(4) == "fast.example"]
    assert len(fast) == 1 and fast[0] < starts[2]
    texts = [text for _, text in lines]
    assert texts.count("throttling rate.example: control/ratelimits limit 2/1 reached") >= 1
    assert "warning: control/ratelimits: ignoring line 'rate.example:2/': want domain:messages/seconds, both 1 or more" in texts
    assert not [l for l in texts if re.match(r"^delivery \d+: (deferral|failure)", l)]
    assert sorted(r for t in smtpd.transactions for r in t.rcpt_tos) == sorted(
        ["r%d@rate.example" % i for i in range(8)] + ["f@fast.example"])


@pytest.mark.slow
@pytest.mark.both_backends
def test_delayed_domain_waits_and_survives_a_restart(qmail_home, smtpd, daemons):
    """control/delaydomains holds deliveries to a domain until birth + delay, for the local
    channel too; a restart meanwhile keeps the hold; nothing is logged as an attempt."""
    users = LocalUsers(qmail_home)
    maildir = os.path.join(users.add("bench"), "Maildir")
    qmail_home.control("delaydomains", "test.example:3\nfast.example:x\n")
    daemons.start()
    daemons.wait_started()
    t0 = time.monotonic()
    queue(qmail_home, [b"bench@test.example", b"f@fast.example"])
    daemons.wait_line(r"^delivery \d+: success: ")          # fast.example is not delayed
    assert not os.listdir(os.path.join(maildir, "new"))
    assert daemons.stop() == 0
    daemons.start()
    daemons.wait_started()
    wait_maildir(maildir, 1)
    assert time.monotonic() - t0 > 2.0                     # birth is a whole second: 3 - 1
    lines = daemons.wait_line(r"^end msg ")
    local = [i for i, l in enumerate(lines) if START.match(l) and START.match(l).group(3) == "local"]
    assert len(local) == 1 and local[0] > lines.index("status: exiting")   # held across the restart
    assert not [l for l in lines if re.match(r"^delivery \d+: (deferral|failure)", l)]
    assert "warning: control/delaydomains: ignoring line 'fast.example:x': want domain:seconds" in lines


@pytest.mark.slow
@pytest.mark.both_backends
def test_sendmail_deliver_after_holds_the_message_until_then(qmail_home, daemons):
    """sendmail -O DeliverAfter=+3: qmail-queue makes the time the mess file's mtime; at
    preprocessing qmail-send hands the channel back to the backend due then (on the
    directory backend the channel file's mtime, where qmail itself looks)."""
    maildir = os.path.join(LocalUsers(qmail_home).add("bench"), "Maildir")
    daemons.start()
    daemons.wait_started()
    done = qmail_home.run(["sendmail", "-O", "DeliverAfter=+3", "bench@test.example"],
                          input=b"Subject: later\n\nbody\n")
    assert done.returncode == 0, done.stderr
    queued = time.monotonic()
    lines = daemons.wait_line(r"^info msg ")
    n = int([l for l in lines if l.startswith("new msg ")][0].split()[2])
    mess = os.path.join(qmail_home.queue, "mess", str(n % 23), str(n))
    not_before = int(os.stat(mess).st_mtime)
    assert not_before > time.time() + 1
    # 'info msg' is logged while the message is preprocessed, before its channel goes back
    # to the backend: wait for the channel file's utime (dir) or the REPLACEMENT (log)
    with INotify() as ino:
        ino.add_watch(os.path.join(qmail_home.queue, "local", str(n % 23)), flags.ATTRIB)
        if os.path.isdir(os.path.join(qmail_home.queue, "log")):
            ino.add_watch(os.path.join(qmail_home.queue, "log"), flags.MODIFY)
        deadline = time.monotonic() + 30
        while schedule(qmail_home, n)[1] != {"local": not_before}:
            assert time.monotonic() < deadline, schedule(qmail_home, n)
            ino.read(timeout=1000)
    wait_maildir(maildir, 1)
    assert time.time() >= not_before and time.monotonic() - queued > 1.5
    lines = daemons.wait_line(r"^end msg %d$" % n)
    assert len([l for l in lines if l.startswith("starting delivery ")]) == 1
    assert not [l for l in lines if re.match(r"^delivery \d+: (deferral|failure)", l)]


def test_bad_not_before_refused_before_anything_is_queued(qmail_home):
    done = qmail_home.run(["sendmail", "-O", "DeliverAfter=soon", "bench@test.example"], input=b"\n")
    assert done.returncode == 64
    assert b"bad -O DeliverAfter=soon: want +SECONDS or YYYY-MM-DDTHH:MM:SSZ" in done.stderr
    done = qmail_home.queue_message(MSG, b"joe@test.example", [b"bench@test.example"],
                                    env=dict(qmail_home.env, QMAILNOTBEFORE="+5"))
    assert done.returncode == 55
    assert os.listdir(os.path.join(qmail_home.queue, "todo")) == []


def test_rule_lines_match_as_smtproutes(qmail_home):
    """The domain itself, then '.parent' lines from the longest parent, then the empty domain."""
    from qmailpy.send.throttlerules import Rules
    qmail_home.control("concurrencydomains", "a.example:1\n.example:2\n.b.example:3\n:4\n# note\n")
    qmail_home.control("delaydomains", "A.Example:60\n")
    rules = Rules.read(qmail_home.path)
    assert rules.warnings == []
    assert [rules.lookup(d)[0] for d in ("a.example", "x.a.example", "b.example", "x.b.example",
                                         "example", "other.test")] == [1, 2, 2, 3, 4, 4]
    assert rules.lookup("a.example") == (1, None, 60)


def test_gate_forgets_idle_domains(qmail_home):
    """A rule for every domain (an empty domain line) keeps state only for domains with
    something in flight, held or in a rate window: qmail-send's memory stays bounded."""
    from qmailpy.send.throttle import SWEEP_MIN, Gate
    from qmailpy.send.throttlerules import Rules
    qmail_home.control("concurrencydomains", ":2\n")
    gate = Gate(Rules.read(qmail_home.path), lambda line: None)
    busy = b"u@busy.example"
    assert gate.admit(busy, 0, 0) is None
    gate.started(0, busy)
    for d in range(1, 5 * SWEEP_MIN):
        address = b"u@d%d.example" % d
        assert gate.admit(address, 0, 0) is None
        gate.started(d, address)
        gate.finished(d)
    assert len(gate.states) <= 2 * SWEEP_MIN
    assert gate.states["busy.example"].inflight == 1


@pytest.mark.slow
def test_a_throttled_wait_costs_qmail_send_no_cpu(qmail_home, smtpd, daemons):
    """The scheduler sleeps until a hold lifts, it does not poll: while a delivery waits
    about 4 s for control/ratelimits rate.example:1/4, qmail-send uses a small fraction of
    a second of CPU (polling would spend the wait's seconds)."""
    qmail_home.control("ratelimits", "rate.example:1/4\n")
    daemons.start()
    daemons.wait_started()
    send = psutil.Process(daemons.proc.pid)
    queue(qmail_home, [b"first@rate.example"])
    daemons.wait_line(r"^delivery \d+: success: ")
    cpu = sum(send.cpu_times()[:2])
    t = time.monotonic()
    queue(qmail_home, [b"second@rate.example"])
    daemons.wait_line(r"^starting delivery \d+: msg \d+ to remote second@rate.example$")
    waited, used = time.monotonic() - t, sum(send.cpu_times()[:2]) - cpu
    assert waited > 2 and used < 0.5, (waited, used)
    assert "throttling rate.example: control/ratelimits limit 1/4 reached" in daemons.lines()
