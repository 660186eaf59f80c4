"""Bad input and crashing deliveries end to end through qmail-start with the real spawners:
each gets its defined temporary or permanent result in qmail-send's log, and no daemon dies."""
import os
import re

import psutil
import pytest

from delivery_support import wait_maildir
from remote_harness import ScriptedPeer

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

DAEMONS = {"qmail-send", "qmail-lspawn", "qmail-rspawn", "qmail-clean"}
BIG = 8 << 20                   # far more than the socket buffers can hold in flight

# the peer reads a little of the body and hangs up: a reset in the middle of DATA
DROP_MID_DATA = [("send", b"220 peer\r\n"), ("line",), ("send", b"250 peer\r\n"),
                 ("line",), ("send", b"250 ok\r\n"), ("line",), ("send", b"250 ok\r\n"),
                 ("line",), ("send", b"354 go\r\n"), ("read", 1 << 20), ("close",)]


def queue(home, sender, recipients, message):
    done = home.queue_message(message, sender, recipients)
    assert done.returncode == 0, done.stderr
    return done


def result_line(lines, channel, recipient):
    """The `delivery d: ...` line of the delivery started for recipient."""
    starts = [re.match(r"starting delivery (\d+): msg \d+ to %s %s$" % (channel, re.escape(recipient)), l)
              for l in lines]
    (d,) = [m.group(1) for m in starts if m]
    (line,) = [l for l in lines if l.startswith("delivery %s: " % d)]
    return line


def alive(procs):
    return {name for name, p in procs.items()
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}


def test_faulty_deliveries_get_their_results_and_no_daemon_dies(qmail_home, users, daemons):
    fault = users.add("fault")
    users.add("fault-", home=fault, dash="-", wildcard=True)
    users.dotqmail(fault, "-unread", "./Maildir/\n", mode=0o000)
    users.dotqmail(fault, "-killed", "|kill -9 $$\n")
    readonly = users.maildir(os.path.join(fault, "readonly"))
    os.chmod(os.path.join(readonly, "tmp"), 0o500)
    users.dotqmail(fault, "-readonly", "./readonly/\n")
    with ScriptedPeer(DROP_MID_DATA, rcvbuf=65536) as peer:
        qmail_home.control("smtproutes", "far.example:127.0.0.1:%d\n" % peer.port)
        daemons.start()
        daemons.wait_started()
        before = daemons.daemons()
        assert set(before) >= DAEMONS
        queue(qmail_home, b"joe@far.example",
              [b"fault-unread@test.example", b"fault-killed@test.example",
               b"fault-readonly@test.example"],
              b"Subject: faults\n\nhello\n")
        queue(qmail_home, b"joe@test.example", [b"ann@far.example"],
              b"Subject: big\n\n" + (b"x" * 79 + b"\n") * (BIG // 80))
        lines = daemons.wait_line(r"^delivery \d+: ", 4)
        assert peer.done.wait(30)
    results = {r: result_line(lines, c, r).split(": ", 1)[1] for c, r in (
        ("local", "fault-unread@test.example"), ("local", "fault-killed@test.example"),
        ("local", "fault-readonly@test.example"), ("remote", "ann@far.example"))}
    assert results == {
        "fault-unread@test.example": "deferral: Unable_to_open_.qmail-unread:_access_denied._(#4.3.0)/",
        "fault-killed@test.example": "deferral: Aack,_child_crashed._(#4.3.0)/",
        "fault-readonly@test.example": "deferral: Temporary_error_on_maildir_delivery._(#4.3.0)/",
        "ann@far.example": "deferral: Connected_to_127.0.0.1_but_connection_died._(#4.4.2)/",
    }
    assert b"\r\n.\r\n" not in peer.received[0]
    # the same four daemons are still there, and they still deliver
    after = daemons.daemons()
    assert alive(after) >= DAEMONS
    assert {n: after[n].pid for n in DAEMONS} == {n: before[n].pid for n in DAEMONS}
    queue(qmail_home, b"joe@far.example", [b"fault@test.example"], b"Subject: fine\n\nok\n")
    lines = daemons.wait_line(r"^delivery \d+: success: did_1\+0\+0/$")
    assert result_line(lines, "local", "fault@test.example").endswith(": success: did_1+0+0/")
    wait_maildir(os.path.join(fault, "Maildir"), 1)
    assert alive(daemons.daemons()) >= DAEMONS
