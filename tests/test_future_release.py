"""A not-before time from every door (docs/queue-format.md "Not-before time"): RFC 4865's
FUTURERELEASE in qmail-smtpd for clients allowed to relay, and the local QMQP socket's
"notbefore=" option, which carries sendmail -O DeliverAfter= and $QMAILNOTBEFORE from callers
without queue rights through qmail-qmqpd. The time lands as the mess file's mtime, which
qmail-send honours (tests/test_send_throttle.py)."""
import calendar
import os
import re
import socket
import threading
import time

import pytest

from qmailpy.mess import MAX_HOLD
from qmailpy.queue.client import ServerSubmission
from qmailpy.smtpd.futurerelease import (R_DENIED, R_SYNTAX, R_TOO_LONG, R_UNAVAILABLE, Refused,
                                         hold_parameter)
from qmqpd_harness import QmqpServer, ask, netstring, request
from queue_view import mtime_of, queued
from smtpd_support import session

pytestmark = pytest.mark.slow

NOW = 1_800_000_000


def test_hold_parameters_parse_as_rfc_4865_says():
    assert hold_parameter(b"SIZE=10", NOW, True) is None
    assert hold_parameter(b"HOLDFOR=3600", NOW, True) == NOW + 3600
    assert hold_parameter(b"holdfor=0", NOW, True) is None                  # no hold
    until = calendar.timegm((2027, 1, 15, 8, 0, 0))
    assert hold_parameter(b"HOLDUNTIL=2027-01-15T08:00:00Z", until - 60, True) == until
    assert hold_parameter(b"HOLDUNTIL=2027-01-15T09:30:00.25+01:30", until - 60, True) == until
    assert hold_parameter(b"HOLDUNTIL=2000-01-01T00:00:00Z", NOW, True) is None   # already come
    for bad in (b"HOLDFOR=-5", b"HOLDFOR=1e3", b"HOLDFOR=", b"HOLDFOR=1234567890",
                b"HOLDUNTIL=tomorrow", b"HOLDUNTIL=2027-13-01T00:00:00Z",
                b"HOLDUNTIL=2027-01-15T08:00:00", b"HOLDFOR=5 HOLDUNTIL=2027-01-15T08:00:00Z",
                b"HOLDFOR", b"HOLDUNTIL", b"HOLDUNTIL=0000-01-01T00:00:00Z",
                b"HOLDUNTIL=2027-02-31T00:00:00Z", b"HOLDUNTIL=2027-01-15T08:00:00+99:99"):
        with pytest.raises(Refused) as e:
            hold_parameter(bad, NOW, True)
        assert e.value.reply == R_SYNTAX, bad
    with pytest.raises(Refused) as e:
        hold_parameter(b"HOLDFOR=%d" % (MAX_HOLD + 1), NOW, True)
    assert e.value.reply == R_TOO_LONG
    with pytest.raises(Refused) as e:
        hold_parameter(b"HOLDFOR=60", NOW, False)
    assert e.value.reply == R_DENIED
    with pytest.raises(Refused) as e:
        hold_parameter(b"HOLDFOR=60", NOW, True, available=False)
    assert e.value.reply == R_UNAVAILABLE


def test_a_relay_client_holds_its_message_with_holdfor(qmail_home):
    with session(qmail_home, RELAYCLIENT="") as s:
        ehlo = s.command(b"EHLO c.example\r\n")
        offered = re.search(rb"\r\n250-FUTURERELEASE (\d+) (\S+)\r\n", ehlo)
        assert offered and int(offered.group(1)) == MAX_HOLD, ehlo
        assert s.command(b"MAIL FROM:<a@b.example> HOLDFOR=3600\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<x@far.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"DATA\r\n") == b"354 go ahead\r\n"
        before = int(time.time())
        assert s.command(b"later\r\n.\r\n").startswith(b"250 ok ")
        after = int(time.time())
        # the next transaction, without the parameter, is not held
        s.command(b"MAIL FROM:<a@b.example>\r\n")
        s.command(b"RCPT TO:<y@far.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(b"now\r\n.\r\n").startswith(b"250 ok ")
    held, now = sorted(queued(qmail_home), key=lambda m: m.recipients)
    assert before + 3600 <= mtime_of(qmail_home, held) <= after + 3600
    assert mtime_of(qmail_home, now) <= time.time() + 1


def test_a_client_not_allowed_to_relay_is_not_offered_a_hold_and_is_refused_one(qmail_home):
    with session(qmail_home) as s:
        assert b"FUTURERELEASE" not in s.command(b"EHLO c.example\r\n")
        assert s.command(b"MAIL FROM:<a@b.example> HOLDFOR=60\r\n") == R_DENIED
        assert s.command(b"RCPT TO:<x@test.example>\r\n") == b"503 MAIL first (#5.5.1)\r\n"
    assert queued(qmail_home) == []


def test_no_hold_through_a_qmailqueue_program(qmail_home):
    """A $QMAILQUEUE program may not read $QMAILNOTBEFORE: the hold is neither offered nor
    taken, rather than accepted and lost."""
    with session(qmail_home, RELAYCLIENT="", QMAILQUEUE="/bin/false") as s:
        assert b"FUTURERELEASE" not in s.command(b"EHLO c.example\r\n")
        assert s.command(b"MAIL FROM:<a@b.example> HOLDFOR=60\r\n") == R_UNAVAILABLE


def test_a_bad_or_too_long_hold_refuses_the_mail_command(qmail_home):
    with session(qmail_home, RELAYCLIENT="") as s:
        s.command(b"EHLO c.example\r\n")
        assert s.command(b"MAIL FROM:<a@b.example> HOLDFOR=soon\r\n") == R_SYNTAX
        assert s.command(b"MAIL FROM:<a@b.example> HOLDFOR=%d\r\n" % (MAX_HOLD + 60)) == R_TOO_LONG
        assert s.command(b"RCPT TO:<x@test.example>\r\n") == b"503 MAIL first (#5.5.1)\r\n"
    assert queued(qmail_home) == []


@pytest.fixture
def server(qmail_home):
    with QmqpServer(qmail_home, "-t", "10") as srv:
        yield srv


@pytest.mark.both_backends
def test_the_local_socket_carries_a_not_before_time(qmail_home, server):
    later = int(time.time()) + 86400
    good = request(b"Subject: later\n\nbody\n", b"a@example.org", [b"b@example.net"], not_before=later)
    assert good.startswith(netstring(b"notbefore=%d" % later))
    assert ask(server.socket, good).startswith(b"Kok ")
    [msg] = queued(qmail_home)
    assert mtime_of(qmail_home, msg) == later


def test_a_caller_without_queue_rights_keeps_its_deliver_after(qmail_home, server, monkeypatch):
    """What sendmail -O DeliverAfter= and qmail-queue's $QMAILNOTBEFORE become for a caller
    that queues through qmail-qmqpd (it was refused with 55: QMQP had no place for it)."""
    later = int(time.time()) + 3600
    sub = ServerSubmission(qmail_home.path, not_before=later)
    sub.write(b"x\n")
    assert sub.finish(b"a@b", [b"c@d"]).ok
    monkeypatch.setenv("QMAILNOTBEFORE", "%d" % (later + 60))
    sub = ServerSubmission(qmail_home.path)
    sub.write(b"y\n")
    assert sub.finish(b"a@b", [b"e@f"]).ok
    monkeypatch.setenv("QMAILNOTBEFORE", "+5")
    sub = ServerSubmission(qmail_home.path)
    sub.write(b"z\n")
    assert sub.finish(b"a@b", [b"g@h"]).code == 55                 # as qmail-queue: nothing made
    times = {m.recipients[0]: mtime_of(qmail_home, m) for m in queued(qmail_home)}
    assert times == {b"c@d": later, b"e@f": later + 60}


def test_a_hold_beyond_the_longest_or_already_past_from_the_socket(qmail_home, server):
    body = request(b"m\n", b"a@b", [b"c@d"])
    too_long = netstring(b"notbefore=%d" % (time.time() + MAX_HOLD + 60)) + body
    assert ask(server.socket, too_long) == b"Dsorry, that hold is longer than I allow (#5.5.4)"
    assert queued(qmail_home) == []
    before = time.time()
    assert ask(server.socket, netstring(b"notbefore=0") + body).startswith(b"Kok ")
    [msg] = queued(qmail_home)
    assert before - 1 <= mtime_of(qmail_home, msg) <= time.time() + 1      # no hold: its real time


def test_a_server_from_before_the_option_is_a_temporary_failure(qmail_home, tmp_path):
    """A qmail-qmqpd not restarted since an upgrade answers the option 'not a QMQP request':
    the sound request must not become a permanent failure (a bounce, a 554)."""
    path = os.path.join(qmail_home.path, "run", "qmqp.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(1)

        def old_server():
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(netstring(b"Dthat is not a QMQP request (#5.5.2)"))

        thread = threading.Thread(target=old_server)
        thread.start()
        sub = ServerSubmission(qmail_home.path, not_before=int(time.time()) + 60)
        sub.write(b"x\n")
        result = sub.finish(b"a@b", [b"c@d"])
        thread.join()
    assert not result.ok and not result.permanent
    assert result.text == b"the queue server takes no hold time; restart qmail-qmqpd (#4.3.0)"


def test_a_bad_option_is_refused_and_nothing_is_queued(qmail_home, server):
    body = request(b"m\n", b"a@b", [b"c@d"])
    for option in (b"notbefore=soon", b"notbefore=", b"holdfor=5", b"x" * 65,
                   b"notbefore=1234567890123"):
        assert ask(server.socket, netstring(option) + body) == b"Dthat is not a QMQP request (#5.5.2)", option
    two = netstring(b"notbefore=5") + netstring(b"notbefore=6") + body
    assert ask(server.socket, two) == b"Dthat is not a QMQP request (#5.5.2)"
    assert queued(qmail_home) == []


def test_qmqp_over_tcp_has_no_options(qmail_home):
    """TCP is qmail's QMQP for null clients: the option is the local socket's only."""
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    with QmqpServer(qmail_home, "--tcp", "127.0.0.1:0") as server:
        later = int(time.time()) + 3600
        assert ask(server.tcp, request(b"m\n", b"a@b", [b"c@d"], not_before=later)) == \
            b"Dthat is not a QMQP request (#5.5.2)"
        assert ask(server.tcp, request(b"m\n", b"a@b", [b"c@d"])).startswith(b"Kok ")
    [msg] = queued(qmail_home)
    assert mtime_of(qmail_home, msg) <= time.time() + 1
