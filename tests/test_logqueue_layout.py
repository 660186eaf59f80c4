"""queue-layout/log-records.conf, the code and the shared state table say the same thing."""
import os

from qmailpy import states
from qmailpy.backends.log import records as R

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "queue-layout", "log-records.conf")


def _lines(kind):
    with open(CONF) as f:
        return [line.split() for line in f if line.split()[:1] == [kind]]


def test_record_codes_names_and_moves_agree():
    rows = _lines("record")
    assert {int(r[1]): r[2] for r in rows} == R.TYPE_NAMES
    for _, _, name, move, fsync, *_ in rows:
        assert tuple(move.split(">")) == states.RECORD_TRANSITIONS[name]
        assert fsync == ("yes" if name in ("ENVELOPE", "DELIVERY") else "no")


def test_header_and_frame_sizes_agree():
    assert sum(int(r[2]) for r in _lines("header")) == R.HEADER_SIZE
    assert sum(int(r[2]) for r in _lines("frame")) == R.RECORD_HEADER_SIZE
    frame = _lines("frame")
    names = [r[1] for r in frame]
    assert sum(int(r[2]) for r in frame[:names.index("flags")]) == R.FLAGS_OFFSET


def test_version_and_flag_values_agree():
    version = [r for r in _lines("header") if r[1] == "version"][0]
    assert int(version[3]) == R.VERSION
    flags = [r for r in _lines("frame") if r[1] == "flags"][0]
    assert flags[3:5] == ["0x%02X" % R.LIVE, '"%s"' % chr(R.LIVE)] and flags[5] == "live,"
    assert flags[6:8] == ["0x%02X" % R.GARBAGE, '"%s"' % chr(R.GARBAGE)] and flags[8] == "garbage"
    with open(os.path.join(os.path.dirname(CONF), "..", "man", "qmail-log-queue.5")) as f:
        man = f.read()
    assert "currently %d;" % R.VERSION in man
    assert "0x%02X\n.Ql %s\nlive, 0x%02X\n.Ql %s\ngarbage" % (R.LIVE, chr(R.LIVE), R.GARBAGE, chr(R.GARBAGE)) in man
