"""qmail-send's rules that need no daemon: rewriting (docs/qmail-send.md "Recipient rewriting"), the retry schedule (docs/qmail-send.md "Scheduling and retries",
checked against the real qmail queue snapshot) and the bounce bytes (docs/qmail-send.md "Bounces")."""
import re

import pytest

from qmailpy.send.bounce import bounce_base, bounce_envelope, bounce_message
from qmailpy.send.rewrite import Rewriter
from qmailpy.retry import is_dying, next_retry
from shared_data import data_file

SECOND_ALRM = 1795323291        # data/README.md: the last pass of every message still queued


def rewriter(virtual=(), percent=()):
    return Rewriter(b"envhost.example", [b"test.example", b"Local.Example"], percent, virtual)


@pytest.mark.parametrize("recipient, expected", [
    (b"joe", ("remote", b"joe@envhost.example")),
    (b"joe@TEST.example", ("local", b"joe@TEST.example")),
    (b"joe@local.example", ("local", b"joe@local.example")),
    (b"joe@far.example", ("remote", b"joe@far.example")),
    (b"joe%far.example@pc.example", ("remote", b"joe@far.example")),
    (b"a%b%test.example@pc.example", ("local", b"a%b@test.example")),
    (b"joe%pc.example", ("remote", b"joe%pc.example@envhost.example")),
    (b"info@virt.example", ("local", b"vu2-info@virt.example")),
    (b"info@a.b.sub.example", ("local", b"deep-info@a.b.sub.example")),
    (b"info@b.sub.example", ("local", b"sub-info@b.sub.example")),
    (b"joe@special.example", ("local", b"one-joe@special.example")),
    (b"other@special.example", ("local", b"dom-other@special.example")),
    (b"joe@novirt.example", ("remote", b"joe@novirt.example")),
])
def test_rewriting(recipient, expected):
    r = rewriter(virtual=[b"virt.example:vu1", b"VIRT.EXAMPLE:vu2", b".sub.example:sub",
                          b".b.sub.example:deep", b"joe@special.example:one", b"special.example:dom",
                          b"novirt.example:", b"no colon line"],
                 percent=[b"PC.example"])
    assert r.route(recipient) == expected


def test_catch_all_virtual_domain():
    r = rewriter(virtual=[b":catchall", b"novirt.example:"])
    assert r.route(b"joe@anything.else") == ("local", b"catchall-joe@anything.else")
    assert r.route(b"joe@novirt.example") == ("remote", b"joe@novirt.example")
    assert r.route(b"joe@test.example") == ("local", b"joe@test.example")


def test_no_virtualdomains_means_remote():
    assert rewriter().route(b"x@y.example") == ("remote", b"x@y.example")


def test_bounce_address_drops_the_virtual_prepend():
    r = rewriter(virtual=[b"virt.example:vu", b".sub.example:sub", b"plain.example:"])
    assert r.strip_virtual_prepend(b"vu-info@virt.example") == b"info@virt.example"
    assert r.strip_virtual_prepend(b"sub-x@a.sub.example") == b"x@a.sub.example"
    assert r.strip_virtual_prepend(b"other-x@virt.example") == b"other-x@virt.example"
    assert r.strip_virtual_prepend(b"vu-x@plain.example") == b"vu-x@plain.example"
    assert r.strip_virtual_prepend(b"noat") == b"noat"


@pytest.mark.parametrize("age, local, remote", [
    (0, 100, 400), (99, 361, 841), (100, 400, 900), (399, 841, 1521), (400, 900, 1600),
    (3600, 4900, 6400),
])
def test_retry_schedule(age, local, remote):
    birth = 1_700_000_000
    assert next_retry(birth, birth + age, "local") == birth + local
    assert next_retry(birth, birth + age, "remote") == birth + remote
    assert next_retry(birth + 50, birth, "remote") == birth + 50 + 400     # birth in the future


def test_dying_after_queuelifetime():
    assert not is_dying(1000, 1000 + 604800, 604800)
    assert is_dying(1000, 1000 + 604801, 604800)


def snapshot_messages():
    with open(data_file("qmail-queue-snapshot.txt")) as f:
        text = f.read()
    found = []
    for block in text.split("\nmsg ")[1:]:
        info = re.search(r"^  info/\S+  size \d+  mtime (\d+)", block, re.M)
        remote = re.search(r"^  remote/\S+  size \d+  mtime (\d+)", block, re.M)
        if info and remote:
            found.append((int(block.split()[0]), int(info.group(1)), int(remote.group(1))))
    return found


def test_schedule_matches_real_qmail_snapshot():
    messages = snapshot_messages()
    assert len(messages) == 21
    for n, birth, due in messages:
        # the snapshot shows info mtimes rounded to the second; qmail truncates: birth may be 1 less
        assert due in {next_retry(b, t, "remote") for b in (birth - 1, birth)
                       for t in (SECOND_ALRM, SECOND_ALRM + 1)}, n


def test_bounce_recipients():
    assert bounce_base(b"owner-@lists.example-@[]") == b"owner-@lists.example"
    assert bounce_envelope(b"joe@a.example", b"pm", b"host.example") == (b"", b"joe@a.example")
    assert bounce_envelope(b"", b"pm", b"host.example") == (b"#@[]", b"pm@host.example")
    assert bounce_envelope(b"#@[]", b"pm", b"host.example") is None


def test_bounce_bytes():
    notes = b"<a@x.example>:\nSorry.\n\n"
    msg = bounce_message(b"joe@a.example", b"joe@a.example", b"MAILER-DAEMON", b"bh.example", notes,
                         b"Received: x\n\nbody\n", when=1704445387)
    assert msg == (
        b"Date: 5 Jan 2024 09:03:07 -0000\n"
        b"From: MAILER-DAEMON@bh.example\n"
        b"To: joe@a.example\n"
        b"Subject: failure notice\n"
        b"\n"
        b"Hi. This is the qmail-send program at bh.example.\n"
        b"I'm afraid I wasn't able to deliver your message to the following addresses.\n"
        b"This is a permanent error; I've given up. Sorry it didn't work out.\n"
        b"\n"
        b"<a@x.example>:\nSorry.\n\n"
        b"--- Below this line is a copy of the message.\n"
        b"\n"
        b"Return-Path: <joe@a.example>\n"
        b"Received: x\n\nbody\n")
    double = bounce_message(b"", b"pm@h.example", b"MAILER-DAEMON", b"bh.example", notes, b"M\n",
                            when=1704445387)
    assert b"To: pm@h.example\n" in double
    assert (b"Hi. This is the qmail-send program at bh.example.\n"
            b"I tried to deliver a bounce message to this address, but the bounce bounced!\n\n"
            b"<a@x.example>:\nSorry.\n\n--- Below this line is the original bounce.\n\n"
            b"Return-Path: <>\nM\n") in double
    quoted = bounce_message(b"a b@x", b"a b@x", b"MAILER DAEMON", b"h", b"", b"", when=0)
    assert b"From: \"MAILER DAEMON\"@h\nTo: \"a b\"@x\n" in quoted
    assert b"Return-Path: <\"a b\"@x>\n" in quoted
