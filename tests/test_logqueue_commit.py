"""Group commit: appends by several processes share fsyncs, and nothing is lost or torn."""
import os
import subprocess
import sys

from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import LogWriter, list_segments, segment_name

WRITER = r"""
import sys
from qmailpy.backends.log.commit import LogWriter
from qmailpy.backends.log.records import encode_envelope
logdir, ident, count, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = LogWriter(logdir, limit)
sys.stdin.read(1)                      # start together
for i in range(count):
    rec = encode_envelope(1, ident * 100000 + i, ident, i, b"s@x", [b"r@y"] * (i % 4))
    seg, start = w.append(rec)
    w.sync_to(seg, start + len(rec))
print(w.fsyncs)
"""


def _all_records(logdir):
    found = []
    for seg in list_segments(logdir):
        with open(os.path.join(logdir, segment_name(seg)), "rb") as f:
            data = f.read()
        assert R.parse_segment_header(data) == seg
        records, problems, end = R.decode(data, seg)
        assert problems == [] and end == len(data)
        found += records
    return found


def test_a_covered_writer_makes_no_fsync(tmp_path):
    logdir = str(tmp_path / "log")
    a, b = LogWriter(logdir), LogWriter(logdir)      # two open files: flock treats them as two processes
    ra, rb = R.encode_envelope(1, 1, 0, 0, b"", []), R.encode_envelope(1, 2, 0, 0, b"", [])
    sa = a.append(ra)
    sb = b.append(rb)
    assert a.sync_to(sa[0], sa[1] + len(ra)) is True        # covers b's record too
    assert b.sync_to(sb[0], sb[1] + len(rb)) is False
    assert a.total_fsyncs() == 1 and b.fsyncs == 0
    c = b.append(ra)
    assert b.sync_to(c[0], c[1] + len(ra)) is True
    assert a.total_fsyncs() == 2


def test_rotation_makes_earlier_appends_durable(tmp_path):
    logdir = str(tmp_path / "log")
    a, b = LogWriter(logdir, 200), LogWriter(logdir, 200)
    rec = R.encode_envelope(1, 1, 0, 0, b"x" * 60, [])
    first = a.append(rec)
    second = b.append(rec)                 # does not fit: rotation fsyncs segment 1
    assert (first[0], second[0]) == (1, 2)
    assert a.sync_to(first[0], first[1] + len(rec)) is False
    assert [r.n for r in _all_records(logdir)] == [1, 1]


def test_concurrent_writer_processes_share_fsyncs(tmp_path):
    logdir = str(tmp_path / "log")
    os.makedirs(logdir)
    procs, count, limit = 6, 60, 16384
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    children = [subprocess.Popen([sys.executable, "-c", WRITER, logdir, str(i + 1), str(count), str(limit)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                for i in range(procs)]
    for c in children:
        c.stdin.write(b"g")
        c.stdin.flush()
    own = []
    for c in children:
        out, _ = c.communicate(timeout=120)
        assert c.returncode == 0
        own.append(int(out))
    records = _all_records(logdir)
    # every record of every writer is there, exactly once, in each writer's order
    assert sorted(r.n for r in records) == sorted(i * 100000 + j for i in range(1, procs + 1)
                                                  for j in range(count))
    for i in range(1, procs + 1):
        mine = [r.qp for r in records if r.uid == i]
        assert mine == list(range(count))
    assert len(list_segments(logdir)) > 1               # rotated at the size limit
    total = LogWriter(logdir).total_fsyncs()
    assert total == sum(own)                             # commits + rotations, all counted
    # group commit: fewer fsyncs than durable appends
    assert total < procs * count, (total, procs * count)
