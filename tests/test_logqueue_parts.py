"""The log backend's parts (qmailpy/backends/log/), each built alone on a real queue
directory from a LogState and the parts its constructor names, without a LogQueue:
the records each appends (read back from the segment files), the files it writes or
removes, and what it returns."""
import os

from logqueue_harness import make_queue, route
from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import list_segments, segment_name
from qmailpy.backends.log.cursor import Cursor
from qmailpy.backends.log.damage import DamageRestorer
from qmailpy.backends.log.deliveries import Deliveries
from qmailpy.backends.log.commands import Commands
from qmailpy.backends.log.enqueue import enqueue
from qmailpy.backends.log.garbage import Garbage
from qmailpy.backends.log.inflight import InFlight
from qmailpy.backends.log.newwork import NewWork
from qmailpy.backends.log.readers import Readers
from qmailpy.backends.log.recovery import CHECKPOINT, Recovery, read_checkpoint
from qmailpy.backends.log.runners import Runners
from qmailpy.backends.log.segments import QUARANTINE, Segments
from qmailpy.backends.log.state import LogState

T = 1_900_000_000


def _state(tmp_path, segment_limit=None):
    warnings = []
    queue = os.path.join(make_queue(tmp_path), "queue")
    return LogState(queue, log=warnings.append, segment_limit=segment_limit, runner_lags=(0,)), warnings


def _queued(state, rcpts=(b"fred@test.example", b"bob@b.example")):
    return enqueue(state.queue, b"Subject: m\n\nm\n", b"joe@a.example", list(rcpts))


def _snapshot(n, prev=R.NOWHERE, due=T, held=False):
    return R.encode_snapshot(R.PREPROCESSED, T, n, prev, T, 1, 2, 10, b"s@x.example", b"", (),
                             {"remote": (due, [(False, b"a@r.example")])}, held)


def _on_disk(state, pos, length):
    with open(os.path.join(state.logdir, segment_name(pos[0])), "rb") as f:
        f.seek(pos[1])
        return f.read(length)


def _records(state):
    return [(r.name, r.n) for r in Readers(state, Segments(state)).scan()]


def test_segments_append_and_read_back_the_bytes(tmp_path):
    state, _ = _state(tmp_path)
    segments = Segments(state)
    data = R.encode_envelope(T, 77, 1, 2, b"s@x.example", [b"a@r.example"])
    pos = segments.append(data)
    assert _on_disk(state, pos, len(data)) == data
    rec = segments.read_at(pos)
    assert (rec.type, rec.n, rec.pos) == (R.ENVELOPE, 77, pos)
    assert segments.tail() == (pos[0], pos[1] + len(data))
    assert segments.segments() == list_segments(state.logdir) == [pos[0]]
    segments.close()


def test_segments_quarantine_a_corrupt_stretch_once(tmp_path):
    state, warnings = _state(tmp_path)
    segments = Segments(state)
    problem = R.Problem(R.CORRUPT, 1, 24, 30)
    segments.problem(problem, b"broken-and-more")
    segments.problem(problem, b"broken-and-more")          # reported once
    with open(os.path.join(state.logdir, QUARANTINE, "1.24"), "rb") as f:
        assert f.read() == b"broken"
    assert state.problems == [problem] and state.damage == [(1, 24)]
    assert warnings == [b"warning: " + problem.describe().encode() + b"\n"]


def test_garbage_write_snapshot_supersedes_and_counts(tmp_path):
    state, _ = _state(tmp_path)
    segments = Segments(state)
    garbage = Garbage(state, segments)
    old = segments.append(_snapshot(5))
    garbage.count(old, 1)
    a = InFlight(5, old, segments.read_at(old))
    a.channels["remote"][1][0][0] = True
    new = garbage.write_snapshot(a, ended=("remote",), now=T + 1)
    rec = segments.read_at(new)
    assert (rec.type, rec.prev, rec.channels["remote"][1]) == (R.REPLACEMENT, old, [(True, b"a@r.example")])
    assert (a.snap, state.garbage, state.live) == (new, {old}, {old[0]: 1})
    # the flag byte on disk stays live until a checkpoint writes it
    assert _on_disk(state, (old[0], old[1] + R.FLAGS_OFFSET), 1) == bytes((R.LIVE,))


def test_garbage_clean_and_delete_empty_segments(tmp_path):
    state, _ = _state(tmp_path, segment_limit=200)
    segments = Segments(state)
    garbage = Garbage(state, segments)
    n = _queued(state)
    first = segments.segments()[0]
    later = segments.append(_snapshot(n))          # a new segment: the limit is passed
    assert later[0] > first
    garbage.count(later, 1)
    garbage.clean(n)                              # no qmail-clean: the body is unlinked
    assert not os.path.exists(os.path.join(state.queue, "mess", str(n % 23), str(n)))
    assert state.removed_unsynced == {n % 23}
    garbage.delete_garbage_segments(segments.tail())
    assert list_segments(state.logdir) == [later[0]] and state.removed_unsynced == set()


def test_newwork_finds_envelopes_and_preprocesses_one(tmp_path):
    state, _ = _state(tmp_path)
    segments = Segments(state)
    garbage = Garbage(state, segments)
    n = _queued(state)
    state.new_cursor = Cursor(segments, (segments.segments()[0], R.HEADER_SIZE))
    newwork = NewWork(state, segments, garbage)
    newwork.scan()
    env = state.pending_new[n]
    announced = []
    done = newwork.preprocess(n, route, announced.append)
    assert (done.sender, done.channels) == (b"joe@a.example", ("local", "remote"))
    rec = segments.read_at(state.active[n].snap)
    assert (rec.type, rec.prev) == (R.PREPROCESSED, env)
    assert rec.channels["local"][1] == [(False, b"fred@test.example")]
    assert state.pending_new == {} and state.garbage == {env}
    assert announced[0] == b"new msg %d\n" % n


def _recovered(tmp_path):
    """A LogState recovered from a queue holding one preprocessed message, and its parts."""
    state, warnings = _state(tmp_path)
    segments = Segments(state)
    garbage = Garbage(state, segments)
    newwork = NewWork(state, segments, garbage)
    restorer = DamageRestorer(state, segments, garbage, Readers(state, segments))
    recovery = Recovery(state, segments, garbage, newwork, restorer)
    n = _queued(state)
    recovery.scan_new()                                # recovers first: nothing before it
    newwork.preprocess(n, route)
    return n, state, segments, garbage, recovery


def test_recovery_rebuilds_the_state_and_writes_a_checkpoint(tmp_path):
    n, state, segments, garbage, recovery = _recovered(tmp_path)
    recovery.checkpoint(force=True)
    cp = read_checkpoint(state.logdir, state.warn)
    assert cp["active"].keys() == {str(n)} and cp["pending"] == {}
    with open(os.path.join(state.logdir, CHECKPOINT), "rb") as f:
        body, crc = f.read().rstrip(b"\n").rsplit(b" ", 1)
    assert int(crc) == R.crc32c(body)
    fresh = LogState(state.queue, runner_lags=(0,))
    fresh_segments = Segments(fresh)
    fresh_garbage = Garbage(fresh, fresh_segments)
    restorer = DamageRestorer(fresh, fresh_segments, fresh_garbage, Readers(fresh, fresh_segments))
    Recovery(fresh, fresh_segments, fresh_garbage, NewWork(fresh, fresh_segments, fresh_garbage),
             restorer).recover()
    assert fresh.recovered and fresh.active == {} and fresh.pending_new == {}
    assert fresh.live == state.live and len(fresh.runners) == 1


def test_runners_offer_what_is_due_and_deliveries_record_the_pass(tmp_path):
    n, state, segments, garbage, recovery = _recovered(tmp_path)
    deliveries = Deliveries(state, segments, garbage, recovery)
    deliveries.reschedule(n, "local", T)
    deliveries.reschedule(n, "remote", T)              # out of flight, due at T
    assert n not in state.active
    runners = Runners(state, segments, recovery)
    assert runners.due(T - 1) == []
    offered = sorted((e.n, e.channel) for e in runners.due(T))
    assert offered == [(n, "local"), (n, "remote")]
    fred, = deliveries.recipients(n, "local")
    deliveries.mark_done(n, "local", fred)
    assert deliveries.finish_channel(n, "local") == ["remote"]
    assert _records(state)[-3:] == [("START", n), ("DELIVERY", n), ("REPLACEMENT", n)]
    assert deliveries.channels_left(n) == ["remote"]


def test_commands_hold_and_delete_append_their_records(tmp_path):
    n, state, segments, garbage, recovery = _recovered(tmp_path)
    deliveries = Deliveries(state, segments, garbage, recovery)
    commands = Commands(state, segments, garbage, recovery, deliveries)
    commands.hold(n)
    assert commands.is_held(n) and segments.read_at(state.active[n].snap).held
    commands.delete(n)
    commands.commit()
    assert _records(state)[-2:] == [("REPLACEMENT", n), ("FINISH", n)]
    assert n not in state.active and state.to_clean == [n]


def test_readers_list_and_count_without_qmail_send(tmp_path):
    state, _ = _state(tmp_path)
    n = _queued(state)
    readers = Readers(state, Segments(state))
    assert readers.counts() == (1, 1)
    assert readers.list_messages() == []                # S4: nothing preprocessed yet
    assert [(r.name, r.n) for r in readers.scan()] == [("ENVELOPE", n)]
