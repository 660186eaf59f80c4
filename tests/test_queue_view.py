"""qmailctl queue list | size | shape, and qmail-send's metrics file, on both backends:
a stopped queue of new messages, then a running qmail-send with a delivered, a
deferred and a bounced recipient (docs/queue-operations.md)."""
import json
import os
import re
import socket
import time

import pytest
from inotify_simple import INotify, flags

from delivery_support import wait_maildir
from qmailpy import snapshot_format
from qmailpy.send import metrics

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def ctl(home, *args):
    return home.run(["qmailctl", "queue", "--home", home.path] + list(args))


def listed_numbers(out):
    return [int(n) for n in re.findall(rb"  #(\d+)  ", out)]


def sizes(home, *extra):
    done = ctl(home, "size", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def queue(home, recipients, body=b"Subject: x\n\ny\n", sender=b"joe@a.example"):
    assert home.queue_message(body, sender, recipients).returncode == 0


def test_a_stopped_queue_of_new_messages(qmail_home):
    queue(qmail_home, [b"x@far.example", b"y@Other.Example"])
    queue(qmail_home, [b"x@far.example"], body=b"Subject: big\n\n" + b"z" * 5000)
    queue(qmail_home, [b"z@sub.far.example"], sender=b"")

    listing = ctl(qmail_home, "list")
    assert listing.returncode == 0, listing.stderr
    numbers = listed_numbers(listing.stdout)
    assert len(numbers) == 3
    assert re.search(rb"GMT  #\d+  \d+  <joe@a.example> \n\ttodo\tx@far.example\n\ttodo\ty@Other.Example\n",
                     listing.stdout), listing.stdout

    def listed(*args):
        done = ctl(qmail_home, "list", *args)
        assert done.returncode == 0, done.stderr
        return sorted(listed_numbers(done.stdout))

    assert len(listed("--recipient-domain", "other.example")) == 1        # case-insensitive
    assert len(listed("--recipient-domain", "far.example")) == 2
    assert len(listed("--recipient-domain", ".far.example")) == 1         # below it
    assert len(listed("--recipient", "X@FAR.example")) == 2
    assert len(listed("--sender", "")) == 1
    assert len(listed("--min-size", "4k")) == 1
    assert len(listed("--max-size", "4k")) == 2
    assert len(listed("--state", "new")) == 3
    assert len(listed("--newer-than", "1h")) == 3
    # filters that match nothing: no output, exit 0
    for args in (["--older-than", "1h"], ["--state", "preprocessed"], ["--state", "remote"],
                 ["--sender", "nobody@nowhere"], ["--recipient-domain", "far.example", "--min-size", "1G"]):
        done = ctl(qmail_home, "list", *args)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), args

    # numbers: the ones asked for; one that is not queued is named on stderr, exit 1
    some = numbers[1]
    done = ctl(qmail_home, "list", str(some))
    assert (done.returncode, listed_numbers(done.stdout)) == (0, [some])
    done = ctl(qmail_home, "list", str(some), "12345678")
    assert done.returncode == 1
    assert listed_numbers(done.stdout) == [some]
    assert done.stderr == b"qmailctl queue: no message #12345678 in the queue\n"
    # bad values: argparse's usage error, exit 2
    for args in (["--older-than", "2x"], ["--min-size", "lots"], ["x12"], ["--state", "frozen"]):
        done = ctl(qmail_home, "list", *args)
        assert done.returncode == 2 and done.stdout == b"", args
    assert b"'2x' is not a duration" in ctl(qmail_home, "list", "--older-than", "2x").stderr

    # JSON lines: every field of a snapshot message record, held and set_aside
    done = ctl(qmail_home, "list", "--json")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == 3
    for record in records:
        assert set(record) == set(snapshot_format.MESSAGE_FIELDS) | {"held", "set_aside"}
        assert record["set_aside"] is None
        snapshot_format.parse_line(json.dumps(record))
        assert record["state"] == "S4" and record["backend"] == qmail_home.backend
        assert record["held"] is False and abs(record["birth"] - time.time()) < 600
        assert {r["channel"] for r in record["recipients"]} == {"todo"}
    big = [r for r in records if r["size"] > 5000]
    assert len(big) == 1 and big[0]["recipients"] == [
        {"channel": "todo", "address": "x@far.example", "done": False}]

    assert sizes(qmail_home) == {"total": 3, "new": 3, "preprocessed": 0, "local": 0,
                                 "remote": 0, "held": 0}
    shape = ctl(qmail_home, "shape")
    assert shape.returncode == 0
    rows = [line.split() for line in shape.stdout.decode().splitlines()]
    assert rows[0] == ["T", "5", "10", "20", "40", "80", "160", "320", "640", "1280", "1280+"]
    assert rows[1] == ["TOTAL", "4", "4"] + ["0"] * 9
    assert rows[2] == ["far.example", "2", "2"] + ["0"] * 9
    assert sorted(r[0] for r in rows[3:]) == ["other.example", "sub.far.example"]
    assert len(ctl(qmail_home, "shape", "-n", "1").stdout.splitlines()) == 3


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_metrics(home, predicate, timeout=30):
    """Wait (inotify on HOME/metrics) until the metrics file satisfies predicate."""
    directory = os.path.join(home.path, metrics.DIRECTORY)
    path = os.path.join(directory, metrics.FILE)
    deadline = time.monotonic() + timeout
    with INotify() as ino:
        ino.add_watch(directory, flags.MOVED_TO | flags.CLOSE_WRITE)
        while True:
            try:
                with open(path) as f:
                    values = metrics.parse(f.read())
                if predicate(values):
                    return values
            except FileNotFoundError:
                values = None
            left = deadline - time.monotonic()
            assert left > 0, "metrics never matched; last: %r" % (values,)
            ino.read(timeout=int(min(left, 1.0) * 1000))


def deliveries_in_log(lines):
    """{(channel, result): count} from qmail-send's starting delivery / delivery lines."""
    channel_of, found = {}, {}
    for line in lines:
        m = re.match(r"starting delivery (\d+): msg \d+ to (local|remote) ", line)
        if m:
            channel_of[m.group(1)] = m.group(2)
        m = re.match(r"delivery (\d+): (success|deferral|failure):", line)
        if m:
            key = (channel_of[m.group(1)], m.group(2))
            found[key] = found.get(key, 0) + 1
    return found


def test_a_running_qmail_send(qmail_home, users, daemons):
    qmail_home.control("smtproutes", "closed.example:127.0.0.1:%d\n" % closed_port())
    qmail_home.control("metricsinterval", "1\n")
    bench = users.add("bench")
    daemons.start().wait_started()
    queue(qmail_home, [b"bench@test.example", b"nobody@closed.example"], sender=b"bench@test.example")
    queue(qmail_home, [b"other@closed.example"], body=b"Subject: big\n\n" + b"z" * 5000,
          sender=b"bench@test.example")
    queue(qmail_home, [b"nosuchuser@test.example"], sender=b"bench@test.example")
    wait_maildir(os.path.join(bench, "Maildir"), 2)           # the first and the bounce
    daemons.wait_line(r"^delivery \d+: deferral: ", 2)
    daemons.wait_idle(2)                                       # the bounced one and its bounce

    listing = ctl(qmail_home, "list", "--state", "remote")
    assert listing.returncode == 0, listing.stderr
    deferred = listed_numbers(listing.stdout)
    assert len(deferred) == 2
    # the local channel is finished (qmail unlinks local/S/n): only the remote one shows
    assert re.search(rb"<bench@test.example> \n\tremote\tnobody@closed.example\n", listing.stdout), \
        listing.stdout
    assert ctl(qmail_home, "list", "--state", "local").stdout == b""
    assert ctl(qmail_home, "list", "--state", "new").stdout == b""
    big = ctl(qmail_home, "list", "--recipient-domain", "closed.example", "--min-size", "4k")
    assert len(listed_numbers(big.stdout)) == 1 and b"other@closed.example" in big.stdout
    # a done recipient no longer selects its message
    assert ctl(qmail_home, "list", "--recipient", "bench@test.example").stdout == b""
    records = [json.loads(l) for l in ctl(qmail_home, "list", "--json").stdout.splitlines()]
    assert sorted(r["n"] for r in records) == sorted(deferred)
    assert all(r["state"] == "S5" and r["birth"] and r["size"] for r in records)

    expected = {"total": 2, "new": 0, "preprocessed": 2, "local": 0, "remote": 2, "held": 0}
    assert sizes(qmail_home) == expected
    assert sizes(qmail_home, "--exact") == expected
    shape = ctl(qmail_home, "shape").stdout.decode().splitlines()
    assert shape[1].split() == ["TOTAL", "2", "2"] + ["0"] * 9
    assert shape[2].split() == ["closed.example", "2", "2"] + ["0"] * 9

    # the metrics file, refreshed every second, then written at exit
    read_metrics(qmail_home, lambda v: v.get('qmail_deliveries_total{channel="remote",result="deferral"}', 0) >= 2
                 and v.get("qmail_queue_messages") == 2)
    assert daemons.stop() == 0
    with open(os.path.join(qmail_home.path, metrics.DIRECTORY, metrics.FILE)) as f:
        values = metrics.parse(f.read())
    logged = deliveries_in_log(daemons.lines())
    assert logged[("local", "success")] == 2 and logged[("local", "failure")] == 1
    for channel in metrics.CHANNELS:
        for result in metrics.RESULTS:
            assert values['qmail_deliveries_total{channel="%s",result="%s"}' % (channel, result)] \
                == logged.get((channel, result), 0), (channel, result)
    assert values['qmail_queue_messages_by_state{state="remote"}'] == 2
    assert values['qmail_throttled_waits_total{channel="remote"}'] == 0
    assert 0 <= values["qmail_queue_oldest_message_age_seconds"] < 600

    # queued while qmail-send is stopped: counted from the records after its counters
    queue(qmail_home, [b"late@far.example"])
    expected.update(total=3, new=1)
    assert sizes(qmail_home) == expected
    assert sizes(qmail_home, "--exact") == expected
    if qmail_home.backend == "log":
        assert os.path.exists(os.path.join(qmail_home.queue, "log", "counts"))
    qstat = qmail_home.run(["qmail-qstat"])
    assert qstat.stdout == (b"messages in queue: 3\n"
                            b"messages in queue but not yet preprocessed: 1\n")
