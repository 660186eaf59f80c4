"""The directory backend's parts (qmailpy/backends/dir/), each built alone on a real queue
directory from a DirState and the parts its constructor names, without a DirQueue: the
bytes each writes and removes, and what it returns."""
import contextlib
import os
import subprocess

from logqueue_harness import make_queue, route
from qmailpy.backends.base import QueueError, Scheduled
from qmailpy.backends.dir.commands import DirCommands
from qmailpy.backends.dir.deliveries import DirDeliveries
from qmailpy.backends.dir.holds import DirHolds
from qmailpy.backends.dir.preprocess import DirPreprocessor
from qmailpy.backends.dir.scan import DirScanner
from qmailpy.backends.dir.state import DirState
from qmailpy.send.clean import CleanClient

T = 1_900_000_000


def _state(tmp_path):
    warnings = []
    queue = os.path.join(make_queue(tmp_path), "queue")
    os.mkdir(os.path.join(queue, "hold"))
    return DirState(queue, log=warnings.append), warnings


@contextlib.contextmanager
def _qmail_clean(qmail_home):
    """A DirState of qmail_home's queue whose cleaner is a running qmail-clean."""
    clean = subprocess.Popen(["qmail-clean"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=qmail_home.env)
    try:
        yield DirState(qmail_home.queue, CleanClient(clean.stdin.fileno(), clean.stdout.fileno()))
    finally:
        clean.stdin.close()
        clean.wait(timeout=30)


def _queued(qmail_home, rcpts=(b"a@test.example", b"x@far.example")):
    assert qmail_home.queue_message(b"m\n", b"joe@a.example", list(rcpts)).returncode == 0
    return max(int(name) for name in os.listdir(os.path.join(qmail_home.queue, "todo")))


def _put(state, rel, data, mtime=None):
    path = state.path(rel)
    with open(path, "wb") as f:
        f.write(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _read(state, rel):
    with open(state.path(rel), "rb") as f:
        return f.read()


def _preprocessed(state, n, birth=T, remote=b"Ta@r.example\0Tb@r.example\0"):
    s = n % 23
    _put(state, "mess/%d/%d" % (s, n), b"Subject: m\n\nm\n")
    _put(state, "info/%d/%d" % (s, n), b"Fs@x.example\0", birth)
    _put(state, "remote/%d/%d" % (s, n), remote, T + 60)


def test_state_file_operations_and_warnings(tmp_path):
    state, warnings = _state(tmp_path)
    _put(state, "bounce/7", b"note")
    assert state.exists("bounce/7") and not state.exists("bounce/8")
    assert state.unlink_quietly("bounce/7") is True
    assert state.unlink_quietly("bounce/7") is False
    state.sync_dir_of("bounce/7")
    state.warn("trouble")
    assert warnings == [b"warning: trouble\n"]
    try:
        state.clean("todo/7")                     # no qmail-clean: the request cannot be made
    except QueueError as e:
        assert str(e) == "qmail-clean unable to clean up todo/7"
    else:
        raise AssertionError("clean() without a cleaner did not fail")


def test_holds_write_the_birth_and_park_until_release(tmp_path):
    state, warnings = _state(tmp_path)
    _preprocessed(state, 30, birth=T)
    holds = DirHolds(state)
    holds.hold(30)
    assert _read(state, "hold/30") == b"%d\n" % T
    entry, other = Scheduled(30, "remote", T + 60), Scheduled(31, "remote", T + 60)
    assert holds.park([entry, other]) == [other]
    assert state.parked == {30: [entry]}
    holds.release(30)
    assert not os.path.exists(state.path("hold/30")) and not holds.is_held(30)
    assert [(e.n, e.channel) for e in state.schedule.due(T + 60, None)] == [(30, "remote")]
    assert warnings == []


def test_holds_load_keeps_a_matching_marker_and_removes_a_stale_one(tmp_path):
    state, warnings = _state(tmp_path)
    _preprocessed(state, 40, birth=T)
    _put(state, "hold/40", b"%d\n" % T)
    _preprocessed(state, 41, birth=T)
    _put(state, "hold/41", b"%d\n" % (T - 5))         # left by an earlier message on the number
    DirHolds(state).load()
    assert state.held == {40: T}
    assert not os.path.exists(state.path("hold/41"))
    assert warnings == [b"warning: removed hold/41 left over from an ended message\n"]


def test_scanner_schedules_by_mtime_and_finishes_a_message_without_body(tmp_path):
    state, warnings = _state(tmp_path)
    _preprocessed(state, 50)
    _preprocessed(state, 51)
    os.unlink(state.path("mess/5/51"))
    _put(state, "bounce/51", b"note")
    scanner = DirScanner(state, DirHolds(state))
    scanner.load(T)
    assert [(e.n, e.channel, e.due) for e in state.schedule.due(T + 60, None)] == [(50, "remote", T + 60)]
    for rel in ("remote/5/51", "bounce/51", "info/5/51"):
        assert not os.path.exists(state.path(rel))
    assert warnings == [b"warning: removed %s left over from an ended message (no mess/5/51)\n" % r
                        for r in (b"remote/5/51", b"bounce/51", b"info/5/51")]


def test_scanner_cleanup_walk_removes_orphans_and_names_stale_bodies(tmp_path):
    state, warnings = _state(tmp_path)
    _put(state, "mess/1/70", b"body", T)
    os.utime(state.path("mess/1/70"), (0, 0))         # atime: long before the 36 hours
    _put(state, "remote/2/71", b"Tx@r.example\0")
    assert list(DirScanner(state, DirHolds(state)).stale_messages(T)).count(70) == 1
    assert not os.path.exists(state.path("remote/2/71"))
    assert warnings == [b"warning: removed remote/2/71 left over from an ended message\n"]


def test_deliveries_mark_done_in_place_and_append_bounce_notes(tmp_path):
    state, _ = _state(tmp_path)
    _preprocessed(state, 60)
    deliveries = DirDeliveries(state, DirHolds(state))
    assert deliveries.info(60) == (b"s@x.example", T)
    first, second = deliveries.recipients(60, "remote")
    assert (first.offset, first.address, second.offset) == (0, b"a@r.example", 13)
    deliveries.mark_done(60, "remote", second)
    assert _read(state, "remote/14/60") == b"Ta@r.example\0Db@r.example\0"
    deliveries.add_bounce_note(60, b"<a@r.example>:\nno\n\n")
    deliveries.add_bounce_note(60, b"<b@r.example>:\nno\n\n")
    assert deliveries.bounce_notes(60) == b"<a@r.example>:\nno\n\n<b@r.example>:\nno\n\n"
    deliveries.reschedule(60, "remote", T + 500)
    assert os.stat(state.path("remote/14/60")).st_mtime == T + 500
    assert deliveries.finish_channel(60, "remote") == []
    assert not os.path.exists(state.path("remote/14/60")) and deliveries.completion_due(60)


def test_commands_delete_unlinks_channels_now_and_the_rest_at_commit(qmail_home):
    n = _queued(qmail_home)
    s = n % 23
    with _qmail_clean(qmail_home) as state:
        holds = DirHolds(state)
        DirPreprocessor(state, DirScanner(state, holds)).preprocess(n, route)
        _put(state, "bounce/%d" % n, b"note")
        holds.hold(n)
        commands = DirCommands(state, holds, DirDeliveries(state, holds))
        assert commands.take([n, n + 1]) == ([n], [])
        commands.delete(n)
        assert not os.path.exists(state.path("remote/%d/%d" % (s, n)))
        assert not os.path.exists(state.path("local/%d/%d" % (s, n)))
        assert os.path.exists(state.path("info/%d/%d" % (s, n)))
        assert os.path.exists(state.path("bounce/%d" % n))
        commands.commit()
        assert state.deleting == [] and not state.unsynced
    for rel in ("info/%d/%d" % (s, n), "bounce/%d" % n, "hold/%d" % n, "mess/%d/%d" % (s, n)):
        assert not os.path.exists(state.path(rel)), rel      # the body: qmail-clean's foop/n


def test_preprocessor_writes_qmails_files_and_has_qmail_clean_remove_todo(qmail_home):
    n, announced = _queued(qmail_home), []
    with _qmail_clean(qmail_home) as state:
        done = DirPreprocessor(state, DirScanner(state, DirHolds(state))).preprocess(
            n, route, announced.append)
    assert (done.n, done.sender, done.channels) == (n, b"joe@a.example", ("local", "remote"))
    s = n % 23
    assert _read(state, "info/%d/%d" % (s, n)) == b"Fjoe@a.example\0"
    assert _read(state, "local/%d/%d" % (s, n)) == b"Ta@test.example\0"
    assert _read(state, "remote/%d/%d" % (s, n)) == b"Tx@far.example\0"
    assert not os.path.exists(state.path("todo/%d" % n))
    assert announced[0] == b"new msg %d\n" % n
    assert announced[1].startswith(b"info msg %d: bytes " % n)
