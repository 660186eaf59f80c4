"""The queue's envelope limits (qmailpy/queuelimits.py, docs/queue-format.md "Envelope limits"):
what qmail-queue, qmail-qmqpd and qmail-smtpd accept can always be recorded, and what
goes beyond is refused whole, with nothing left queued."""
import os
import subprocess

import pytest

from qmailpy.backends.log import records as R
from qmailpy.envelope import MAX_ADDRESS, bounce_note
from qmailpy.queuelimits import (BOUNCE_TEXT_MAX, DEFAULT_MAXRCPT, ENVELOPE_BUDGET, REWRITE_ALLOWANCE,
                                 EnvelopeBudget, bounce_text)
from qmqpd_harness import QmqpServer, ask, netstring
from queue_view import leftovers, queued
from smtpd_support import SmtpdProcess

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]
TIMEOUT = 60
TOO_MANY = b"Dtoo many recipients for qq (#5.5.3)"


def qmail_queue(home, sender, recipients, message=b"Subject: x\n\nx\n"):
    env = b"F" + sender + b"\0" + b"".join(b"T" + r + b"\0" for r in recipients) + b"\0"
    env_r, env_w = os.pipe()
    proc = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=env_r,
                            stderr=subprocess.PIPE, env=home.env)
    os.close(env_r)
    proc.stdin.write(message)
    proc.stdin.close()
    with os.fdopen(env_w, "wb") as f:
        try:
            f.write(env)
        except BrokenPipeError:
            pass
    code = proc.wait(timeout=TIMEOUT)
    assert proc.stderr.read() == b""
    return code


def address(i, length):
    tail = b"%d@example.net" % i
    return b"r" * (length - len(tail)) + tail


def most_that_fit(length):
    budget = EnvelopeBudget(0)
    while budget.admit(length):
        pass
    return budget.count


def test_the_largest_snapshot_an_accepted_envelope_can_need_fits_a_record():
    """The worst case the budget allows, built with the log backend's own encoder: every
    recipient as long as allowed and rewritten by the whole allowance, every one failed
    with a report far longer than a note keeps. It fits; without the cut it would not."""
    count = most_that_fit(MAX_ADDRESS)
    assert 4000 < count < 5000
    routed = [address(i, MAX_ADDRESS + REWRITE_ALLOWANCE) for i in range(count)]
    report = b"5.1.1 mailbox unavailable\n" * 2000          # 52000 bytes: a long remote reply
    kept = bounce_text(report)
    assert len(kept) > BOUNCE_TEXT_MAX and kept.startswith(report[:BOUNCE_TEXT_MAX])
    notes = bounce_note(routed[0], kept) * count          # every note as long as the first
    channels = {"remote": (0, [(True, a) for a in routed])}
    record = R.encode_snapshot(R.REPLACEMENT, 1, 1, (1, 24), 1, 1, 1, 1, b"s" * MAX_ADDRESS, notes,
                               (), channels)
    assert len(record) - R.RECORD_HEADER_SIZE <= R.MAX_PAYLOAD
    assert len(bounce_note(routed[0], report)) * count > R.MAX_PAYLOAD     # uncut: far too large
    assert not EnvelopeBudget(0).admit(ENVELOPE_BUDGET)


def test_qmail_queue_refuses_recipients_beyond_maxrcpt_and_leaves_nothing(qmail_home):
    qmail_home.control("maxrcpt", "3\n")
    assert qmail_queue(qmail_home, b"a@example.org", [address(i, 40) for i in range(4)]) == 12
    assert leftovers(qmail_home) == []
    assert qmail_queue(qmail_home, b"a@example.org", [address(i, 40) for i in range(3)]) == 0
    [msg] = queued(qmail_home)
    assert len(msg.recipients) == 3


def test_qmail_queue_refuses_an_envelope_beyond_the_byte_bound_at_real_sizes(qmail_home):
    """No count cap (maxrcpt 0): the byte bound alone stops the envelope, at the real 64 MiB."""
    qmail_home.control("maxrcpt", "0\n")
    count = most_that_fit(MAX_ADDRESS)
    rcpts = [address(i, MAX_ADDRESS) for i in range(count + 1)]
    assert qmail_queue(qmail_home, b"a@example.org", rcpts) == 12
    assert leftovers(qmail_home) == []
    assert qmail_queue(qmail_home, b"a@example.org", rcpts[:count]) == 0
    assert [len(m.recipients) for m in queued(qmail_home)] == [count]


def test_qmqp_socket_answers_too_many_recipients_and_queues_nothing(qmail_home):
    qmail_home.control("maxrcpt", "5\n")
    def req(count):
        body = netstring(b"Subject: x\n\nx\n") + netstring(b"a@example.org") + b"".join(
            netstring(address(i, 60)) for i in range(count))
        return netstring(body)
    with QmqpServer(qmail_home) as server:
        assert ask(server.socket, req(6)) == TOO_MANY
        assert leftovers(qmail_home) == []
        assert ask(server.socket, req(5)).startswith(b"Kok ")
    assert [len(m.recipients) for m in queued(qmail_home)] == [5]


def test_smtp_rcpt_beyond_the_default_cap_gets_452_and_the_message_keeps_the_rest(qmail_home):
    """No control/maxrcpt: the default, 1000. A pipelining client's RCPTs past it get 452
    each, DATA still queues the message for the first 1000."""
    extra = 5
    with SmtpdProcess(qmail_home) as s:
        s.reply()
        s.command(b"HELO c\r\n")
        s.command(b"MAIL FROM:<a@example.org>\r\n")
        s.send(b"".join(b"RCPT TO:<%s>\r\n" % address(i, 60).replace(b"example.net", b"test.example")
                        for i in range(DEFAULT_MAXRCPT + extra)))
        replies = [s.reply() for _ in range(DEFAULT_MAXRCPT + extra)]
        assert replies[:DEFAULT_MAXRCPT] == [b"250 ok\r\n"] * DEFAULT_MAXRCPT
        assert replies[DEFAULT_MAXRCPT:] == [b"452 sorry, too many recipients (#4.5.3)\r\n"] * extra
        assert s.command(b"DATA\r\n").startswith(b"354")
        assert s.command(b"hi\r\n.\r\n").startswith(b"250 ")
    [msg] = queued(qmail_home)
    assert len(msg.recipients) == DEFAULT_MAXRCPT
    assert msg.recipients[-1] == address(DEFAULT_MAXRCPT - 1, 60).replace(b"example.net", b"test.example")
