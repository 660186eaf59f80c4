"""Our qmail-send log lines, line by line, against a real C qmail log
(shared/data/qmail-send-sample.epoch.log): every line we write must have the shape of
a line qmail wrote, and every kind qmail wrote in that run must show up here."""
import re

import pytest

from qmailpy import logline
from send_harness import Daemons
from shared_data import data_file

pytestmark = pytest.mark.slow

MSG = b"Subject: wording\n\nhi\n"


def shape(line):
    line = re.sub(r"^(starting delivery \d+: msg \d+ to (local|remote)) \S+$", r"\1 X", line)
    line = re.sub(r"^(delivery \d+: (success|failure|deferral)): \S+$", r"\1: X", line)
    line = re.sub(r"from <[^ ]*>", "from <X>", line)
    return re.sub(r"\d+", "N", line)


def sample_lines():
    with open(data_file("qmail-send-sample.epoch.log"), encoding="utf-8", errors="surrogateescape") as f:
        return [logline.parse_prefix(l.rstrip("\n"))[2] for l in f]


def test_our_lines_have_qmails_wording(qmail_home):
    d = Daemons(qmail_home, fake=True)
    d.start()
    try:
        d.wait_line(r"^status: ")
        for sender, rcpts in ((b"joe@test.example", [b"ok@test.example", b"ok@far.example"]),
                              (b"joe@far.example", [b"fail-1@test.example"]),
                              (b"#@[]", [b"fail-2@test.example"]),
                              (b"joe@test.example", [b"defer-1@far.example"])):
            assert qmail_home.queue_message(MSG, sender, rcpts).returncode == 0
        d.wait_line(r"^triple bounce: ")
        d.wait_line(r"^delivery \d+: deferral: ")
        d.wait_line(r"^end msg ", 4)
        assert d.stop() == 0
    finally:
        d.kill()
    ours = d.lines()
    sample = sample_lines()
    sample_shapes = {shape(l) for l in sample}
    # qmail adds " exitasap" to status lines written after SIGTERM (docs/qmail-send.md "Log (fd 0, unbuffered, one line per event)"); the sample run
    # had no delivery in flight when it was stopped, so it has none of those
    sample_shapes.add("status: local N/N remote N/N exitasap")
    for line in ours:
        assert logline.parse(line).kind not in ("unknown", "alert", "warning"), line
        assert shape(line) in sample_shapes, line
    kinds = {logline.parse(l).kind for l in ours}
    assert kinds == {logline.parse(l).kind for l in sample}
