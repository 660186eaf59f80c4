"""The log backend's record format: round trips, checksums, torn tails, corrupt middles."""
import os
import shutil
import time

import pytest
from hypothesis import given, settings, strategies as st

from qmailpy.backends.log import records as R
from qmailpy.backends.log.queue import LogQueue
from qmailpy.backends.log.segments import QUARANTINE
from qmailpy.backends.log.enqueue import enqueue

import knobs
from logqueue_harness import deliver_all, deliveries, make_queue, route

addr = st.binary(max_size=60)
t32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
pos = st.tuples(t32, u64)
rcpts = st.lists(st.tuples(st.booleans(), addr), max_size=5)
channels = st.dictionaries(st.sampled_from(R.CHANNELS), st.tuples(u64, rcpts))

records = st.one_of(
    st.builds(lambda t, n, u, q, s, r: (R.encode_envelope(t, n, u, q, s, r),
                                         dict(uid=u, qp=q, sender=s, recipients=r)),
              t32, u64, t32, t32, addr, st.lists(addr, max_size=5)),
    st.builds(lambda ty, t, n, p, b, q, u, sz, s, no, e, ch, h: (
        R.encode_snapshot(ty, t, n, p, b, q, u, sz, s, no, e, ch, h),
        dict(prev=p, birth=b, qp=q, uid=u, size=sz, sender=s, notes=no,
             ended=tuple(c for c in R.CHANNELS if c in e), channels=ch, held=h)),
        st.sampled_from(R.SNAPSHOTS), t32, u64, pos, u64, t32, t32, u64, addr, st.binary(max_size=80),
        st.sets(st.sampled_from(R.CHANNELS)), channels, st.booleans()),
    st.builds(lambda t, n, p, c: (R.encode_start(t, n, p, c), dict(snapshot=p, channel=c)),
              t32, u64, pos, st.sampled_from(R.CHANNELS)),
    st.builds(lambda t, n, c, i, r: (R.encode_delivery(t, n, c, i, r), dict(channel=c, index=i, result=r)),
              t32, u64, st.sampled_from(R.CHANNELS), t32, st.sampled_from([R.SUCCESS, R.FAILURE])),
    st.builds(lambda t, n, o, b: (R.encode_bounce_note(t, n, o, b), dict(op=o, note=b)),
              t32, u64, st.sampled_from([R.NOTE_ADD, R.NOTE_CLEAR]), st.binary(max_size=80)),
    st.builds(lambda t, n, p: (R.encode_finish(t, n, p), dict(prev=p)), t32, u64, pos),
)


def _normal(fields):
    out = dict(fields)
    if "channels" in out:
        out["channels"] = {c: (d, [(bool(x), a) for x, a in r]) for c, (d, r) in out["channels"].items()}
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=6))
def test_records_round_trip(items):
    data = R.segment_header(7) + b"".join(frame for frame, _ in items)
    assert R.parse_segment_header(data) == 7
    decoded, problems, end = R.decode(data, 7)
    assert problems == [] and end == len(data)
    assert [_normal(r.fields) for r in decoded] == [_normal(f) for _, f in items]
    offset = R.HEADER_SIZE
    for rec, (frame, _) in zip(decoded, items):
        assert rec.pos == (7, offset) and rec.length == len(frame)
        offset += len(frame)


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_native_crc32c_matches_the_definition(data, seed):
    assert R.crc32c(data, seed) == R.crc32c_python(data, seed)


def test_crc32c_check_value():
    assert R.crc32c(b"123456789") == 0xE3069283 == R.crc32c_python(b"123456789")


def test_garbage_flag_is_outside_the_checksum():
    frame = bytearray(R.encode_finish(1, 2, (1, 24)))
    frame[R.FLAGS_OFFSET] = R.GARBAGE
    rec = R.decode_one(bytes(frame))
    assert rec is not None and rec.garbage
    frame[R.FLAGS_OFFSET + 1] ^= 1
    assert R.decode_one(bytes(frame)) is None


def test_bad_segment_headers_are_refused():
    head = R.segment_header(3)
    with pytest.raises(R.RecordError):
        R.parse_segment_header(b"NOTALOG!" + head[8:])
    with pytest.raises(R.RecordError):
        R.parse_segment_header(head[:10] + bytes([head[10] ^ 1]) + head[11:])


# --- whole queues: torn tails and corrupt middles -------------------------------------

def _queue_with_messages(tmp_path, count):
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    ns = [enqueue(queue, b"Subject: %d\n\nbody\n" % i, b"s@x.example", [b"u%d@test.example" % i])
          for i in range(count)]
    seg = os.path.join(queue, "log", "0000000001.seg")
    return home, ns, seg


@pytest.mark.slow
def test_torn_tail_at_every_byte_of_the_last_record(tmp_path):
    home, ns, seg = _queue_with_messages(tmp_path, 4)
    with open(seg, "rb") as f:
        data = f.read()
    records, _, _ = R.decode(data, 1)
    last = records[-1]
    start = last.pos[1]
    assert start + last.length == len(data)
    for cut in range(start, len(data)):
        os.truncate(seg, cut)
        fd = os.open(os.path.join(home, "queue", "log", "commit"), os.O_WRONLY)
        os.pwrite(fd, cut.to_bytes(8, "little"), 8)       # the append end, as a dead appender leaves it
        os.close(fd)
        for name in ("checkpoint",):
            try:
                os.unlink(os.path.join(home, "queue", "log", name))
            except FileNotFoundError:
                pass
        warnings = []
        lq = LogQueue(home, log=warnings.append)
        lq.startup()
        assert sorted(lq.new_work()) == sorted(ns[:-1]), cut
        if cut > start:
            assert [p.kind for p in lq.state.problems] == [R.TORN]
            assert warnings and b"torn record at offset %d" % start in warnings[0]
        else:
            assert lq.state.problems == []
        lq.close()
        # the torn bytes were cut off: the head ends at the last good record again
        assert os.path.getsize(seg) == start
        with open(seg, "r+b") as f:
            f.write(data)


def test_flipped_byte_in_a_middle_record_is_quarantined_and_reported(tmp_path):
    home, ns, seg = _queue_with_messages(tmp_path, 5)
    with open(seg, "rb") as f:
        data = bytearray(f.read())
    records, _, _ = R.decode(bytes(data), 1)
    victim = records[2]
    data[victim.pos[1] + R.RECORD_HEADER_SIZE + 5] ^= 0x40
    with open(seg, "wb") as f:
        f.write(data)
    warnings = []
    lq = LogQueue(home, log=warnings.append)
    lq.startup()
    assert sorted(lq.new_work()) == sorted(ns[:2] + ns[3:])
    assert [(p.kind, p.start, p.end) for p in lq.state.problems] == [
        (R.CORRUPT, victim.pos[1], victim.pos[1] + victim.length)]
    assert any(b"corrupt record at offset %d" % victim.pos[1] in w for w in warnings)
    qfile = os.path.join(home, "queue", "log", QUARANTINE, "1.%d" % victim.pos[1])
    with open(qfile, "rb") as f:
        assert f.read() == bytes(data[victim.pos[1]:victim.pos[1] + victim.length])
    # the body of the message whose envelope is quarantined is never cleaned as stale
    assert list(lq.stale_messages(2**40)) == []
    lq.close()


# --- damaged bytes anywhere in a middle record, flags included ------------------------

def _history_queue(tmp_path):
    """A queue whose log holds every record type, all followed by a later record.

    Message a: local done, one remote bounced, one remote deferred an hour (its
    REPLACEMENT is live); b: delivered and finished; c: enqueued last (live ENVELOPE).
    Returns the home and the (n, recipient) deliveries still owed."""
    home = make_queue(tmp_path)
    queue = os.path.join(home, "queue")
    na = enqueue(queue, b"a\n", b"s@x.example", [b"a@test.example", b"b@r.example", b"c@r.example"])
    nb = enqueue(queue, b"b\n", b"s@x.example", [b"d@test.example"])
    lq = LogQueue(home)
    lq.startup()
    for n in lq.new_work():
        lq.preprocess(n, route)
    for rec in lq.recipients(na, "local"):
        lq.mark_done(na, "local", rec)
    lq.finish_channel(na, "local")
    bounced = lq.recipients(na, "remote")[1]
    lq.add_bounce_note(na, b"<c@r.example>:\nno\n\n")
    lq.mark_done(na, "remote", bounced)
    lq.reschedule(na, "remote", int(time.time()) + 3600)
    lq.mark_done(nb, "local", lq.recipients(nb, "local")[0])
    lq.finish_channel(nb, "local")
    lq.complete(nb)
    lq.checkpoint(force=True)                     # garbage flags written in place
    lq.close()
    nc = enqueue(queue, b"c\n", b"s@x.example", [b"e@r.example"])
    return home, {(na, b"b@r.example"), (nc, b"e@r.example")}


def _damage_and_deliver(base, work, offset, value, checkpoint):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work, symlinks=True)
    seg = os.path.join(work, "queue", "log", "0000000001.seg")
    with open(seg, "r+b") as f:
        f.seek(offset)
        f.write(bytes((value,)))
    if not checkpoint:
        os.unlink(os.path.join(work, "queue", "log", "checkpoint"))
    lq = LogQueue(work)
    try:
        lq.startup()
        deliver_all(lq, os.path.join(work, "deliveries"), now=int(time.time()) + 10**6)
        return lq.state.problems, set(deliveries(os.path.join(work, "deliveries")))
    finally:
        lq.close()


PAYLOAD_STRIDE = 4


@pytest.mark.slow
def test_every_damaged_byte_of_a_middle_record_is_delivered_or_reported(tmp_path):
    base, owed = _history_queue(tmp_path / "base")
    with open(os.path.join(base, "queue", "log", "0000000001.seg"), "rb") as f:
        data = f.read()
    records, problems, _ = R.decode(data, 1)
    assert problems == []
    assert {r.type for r in records[:-1]} == set(R.TYPE_NAMES)
    assert any(r.garbage for r in records) and any(r.flags == R.LIVE and r.type in R.SNAPSHOTS
                                                   for r in records)
    work = str(tmp_path / "work")
    for index, rec in enumerate(records[:-1]):    # the last (c's ENVELOPE) is the tail
        start = rec.pos[1]
        flag = start + R.FLAGS_OFFSET
        # Every header byte; of the payload, which one CRC covers alike, every
        # PAYLOAD_STRIDE-th byte, each record from another phase (QMAILPY_TEST_DAMAGE_FULL=1: every byte).
        stride = 1 if knobs.DAMAGE_FULL else PAYLOAD_STRIDE
        offsets = [i for i in range(rec.length)
                   if i < R.RECORD_HEADER_SIZE or (i - index) % stride == 0]
        cases = [(start + i, data[start + i] ^ 0x01, True) for i in offsets]
        values = {data[flag] ^ (1 << b) for b in range(8)} | {0, 1, 0xFF, R.LIVE} - {R.GARBAGE}
        cases += [(flag, v, checkpoint) for v in sorted(values) for checkpoint in (True, False)]
        for offset, value, checkpoint in cases:
            found, delivered = _damage_and_deliver(base, work, offset, value, checkpoint)
            assert found or owed <= delivered, (rec, offset - start, value, checkpoint, delivered)


def test_a_damaged_flag_on_a_live_snapshot_is_reported_and_the_message_kept(tmp_path):
    base, owed = _history_queue(tmp_path / "base")
    with open(os.path.join(base, "queue", "log", "0000000001.seg"), "rb") as f:
        records, _, _ = R.decode(f.read(), 1)
    live = [r for r in records if r.type in R.SNAPSHOTS and not r.garbage]
    assert len(live) == 1
    offset = live[0].pos[1] + R.FLAGS_OFFSET
    found, delivered = _damage_and_deliver(base, str(tmp_path / "work"), offset, R.LIVE ^ 0x01, True)
    assert owed <= delivered
    assert [(p.kind, p.start, p.flags) for p in found] == [(R.FLAG, live[0].pos[1], R.LIVE ^ 0x01)]
    assert "damaged garbage flag 0x4d" in found[0].describe()


def test_a_held_snapshot_is_never_due():
    """The held bit of `sched` (qmailctl queue hold): the runners' light read gives no
    due times for it, so a held message is never offered."""
    chans = {"local": (0, [(False, b"a@b.example")])}
    held = R.encode_snapshot(R.REPLACEMENT, 5, 9, R.NOWHERE, 1, 2, 3, 4, b"s", b"", (), chans, True)
    free = R.encode_snapshot(R.REPLACEMENT, 5, 9, R.NOWHERE, 1, 2, 3, 4, b"s", b"", (), chans)
    assert R.schedule(held) == (R.REPLACEMENT, R.LIVE, 5, 9, None)
    assert R.schedule(free) == (R.REPLACEMENT, R.LIVE, 5, 9, {"local": 0})
    assert R.decode_one(held).held and not R.decode_one(free).held
