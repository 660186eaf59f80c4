"""logline.py against the real notqmail log in shared/data: exact counts, and our
writers reproduce every line of it byte for byte."""
import collections

import pytest

from qmailpy import logline

from shared_data import data_file

EPOCH = data_file("qmail-send-sample.epoch.log")
TAI64N = data_file("qmail-send-sample.tai64n.log")

needs_data = pytest.mark.skipif(EPOCH is None, reason="shared/data fixtures not found")

EXPECTED_KINDS = {
    "status": 963, "exiting": 1, "new msg": 333, "info msg": 333, "starting delivery": 481,
    "delivery": 481, "bounce msg": 45, "triple bounce": 2, "end msg": 312,
}


def events(path):
    with open(path, "rb") as f:
        return [logline.parse(line) for line in f]


@needs_data
@pytest.mark.parametrize("path", [EPOCH, TAI64N])
def test_sample_counts_are_exact(path):
    evs = events(path)
    assert len(evs) == 2951
    assert dict(collections.Counter(e.kind for e in evs)) == EXPECTED_KINDS
    results = collections.Counter(e.fields["result"] for e in evs if e.kind == "delivery")
    assert results == {"success": 353, "failure": 47, "deferral": 81}
    channels = collections.Counter(e.fields["channel"] for e in evs if e.kind == "starting delivery")
    assert channels == {"local": 305, "remote": 176}
    assert len({e.fields["n"] for e in evs if e.kind == "new msg"}) == 260


@needs_data
def test_tai64n_and_epoch_times_agree():
    for a, b in zip(events(EPOCH), events(TAI64N)):
        assert a.text == b.text
        assert abs(a.time - b.time) < 1e-6


def render(e):
    f = e.fields
    if e.kind == "status":
        return logline.status(f["local_used"], f["local_limit"], f["remote_used"],
                              f["remote_limit"], f["exitasap"])
    if e.kind == "exiting":
        return logline.status_exiting()
    if e.kind == "new msg":
        return logline.new_msg(f["n"])
    if e.kind == "info msg":
        return logline.info_msg(f["n"], f["bytes"], f["sender"].encode(), f["qp"], f["uid"])
    if e.kind == "starting delivery":
        return logline.starting_delivery(f["d"], f["n"], f["channel"], f["recipient"].encode())
    if e.kind == "delivery":
        return logline.delivery(f["d"], f["result"], f["text"].encode())
    if e.kind == "bounce msg":
        return logline.bounce_msg(f["n"], f["qp"])
    if e.kind == "triple bounce":
        return logline.triple_bounce(f["n"])
    if e.kind == "end msg":
        return logline.end_msg(f["n"])
    raise AssertionError(e.kind)


@needs_data
def test_writers_reproduce_every_sample_line():
    with open(EPOCH, "rb") as f:
        for raw in f:
            e = logline.parse(raw)
            assert render(e) == raw.split(b" ", 1)[1], raw


def test_safe_rendering_of_texts_and_addresses():
    assert logline.delivery(3, "failure", b"Sorry, no mailbox here by that name. (#5.1.1)\n") == \
        b"delivery 3: failure: Sorry,_no_mailbox_here_by_that_name._(#5.1.1)/\n"
    assert logline.info_msg(7, 10, b"a b%c@x\xff", 1, 0) == \
        b"info msg 7: bytes 10 from <a_b_c@x_> qp 1 uid 0\n"
    assert logline.status(0, 10, 0, 20) == b"status: local 0/10 remote 0/20\n"
    assert logline.status(1, 10, 2, 20, exitasap=True) == b"status: local 1/10 remote 2/20 exitasap\n"


@pytest.mark.parametrize("line, when, host", [
    ("1795323135.653157 end msg 5", 1795323135.653157, None),
    ("@400000006b02750926ee6288 end msg 5", 1795323135.653157, None),
    ("2026-11-22T04:52:15.653157+00:00 end msg 5", 1795323135.653157, None),
    ("2026-11-22T05:52:15+0100 mx1 qmail-send[812]: end msg 5", 1795323135.0, "mx1"),
    ("2026-11-22T04:52:15.653157Z end msg 5", 1795323135.653157, None),
    ("1795323135 end msg 5", 1795323135.0, None),          # epoch without a fraction
])
def test_timestamp_prefixes(line, when, host):
    e = logline.parse(line)
    assert e.kind == "end msg" and e.fields == {"n": 5}
    assert abs(e.time - when) < 1e-6
    assert e.host == host


def test_unknown_and_truncated_lines():
    assert logline.parse("1795323135.1 something else").kind == "unknown"
    assert logline.parse("1795323135.1 info msg 5: bytes 1").kind == "unknown"
    assert logline.parse("alert: oh no! lost qmail-clean connection! dying...").kind == "alert"


def test_integer_epoch_stamps():
    e = logline.parse("1795000000 new msg 5")
    assert (e.kind, e.fields, e.time, e.text) == ("new msg", {"n": 5}, 1795000000.0, "new msg 5")
    assert logline.parse_prefix("1795000000 delivery 3: success: ok/") == (
        1795000000.0, None, "delivery 3: success: ok/")
    # a number that is too short for a time stays part of the line
    assert logline.parse("17950 new msg 5").kind == "unknown"


def test_iso_prefix_before_a_line_that_looks_like_a_journald_tag():
    # qmailctl start's stamp, then qmail's own "delivery 3:" — not host "delivery".
    line = "2026-11-22T05:49:38.889725Z delivery 3: success: did_1+0+0/"
    assert logline.parse_prefix(line) == (1795326578.889725, None, "delivery 3: success: did_1+0+0/")
    e = logline.parse(line)
    assert e.kind == "delivery" and e.host is None and e.fields["d"] == 3
    journald = "2026-11-22T05:49:38+0000 mx1 qmail-send[7]: delivery 3: success: did_1+0+0/"
    assert logline.parse_prefix(journald)[1] == "mx1"
    assert logline.parse(journald).host == "mx1"
