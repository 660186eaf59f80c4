"""The directory backend owns its schedule (backends/base.py): startup() loads it from the
channel files' mtimes, due() hands out what is due once, reschedule() takes a channel
back, run_all_now() makes everything due, save_schedule() writes it back at exit."""
import os

from qmailpy.backends.dir.queue import DirQueue

from logqueue_harness import make_queue

T = 1_900_000_000


def _waiting(home, n, due):
    """A preprocessed message n whose remote channel is next due at `due`."""
    queue = os.path.join(home, "queue")
    for kind, data in (("mess", b"Subject: m\n\nm\n"), ("info", b"Fs@x.example\0"),
                       ("remote", b"Tr%d@y.example\0" % n)):
        path = os.path.join(queue, kind, str(n % 23), str(n))
        with open(path, "wb") as f:
            f.write(data)
    os.utime(os.path.join(queue, "remote", str(n % 23), str(n)), (due, due))
    return os.path.join(queue, "remote", str(n % 23), str(n))


def _offered(entries):
    return sorted((e.n, e.channel, e.due) for e in entries)


def test_startup_loads_the_schedule_and_due_hands_each_entry_out_once(tmp_path):
    home = make_queue(tmp_path)
    _waiting(home, 101, T + 100)
    _waiting(home, 102, T + 50)
    dq = DirQueue(home)
    dq.startup()                                    # now is before T: nothing due yet
    assert len(dq.schedule) == 2
    assert dq.next_wakeup() == T + 50
    assert dq.due(T + 49) == []
    assert _offered(dq.due(T + 50)) == [(102, "remote", T + 50)]
    assert dq.due(T + 99) == []
    assert _offered(dq.due(T + 1000)) == [(101, "remote", T + 100)]
    assert dq.due(T + 2000) == [] and dq.next_wakeup() is None


def test_reschedule_takes_the_channel_back_and_writes_its_time(tmp_path):
    home = make_queue(tmp_path)
    remote = _waiting(home, 103, T)
    dq = DirQueue(home)
    dq.startup()
    entry, = dq.due(T)
    dq.reschedule(entry.n, "remote", T + 400)
    assert os.stat(remote).st_mtime == T + 400      # a crash does not make it due at once
    assert dq.next_wakeup() == T + 400
    assert dq.due(T + 399) == []
    assert _offered(dq.due(T + 400)) == [(103, "remote", T + 400)]


def test_run_all_now_and_save_schedule(tmp_path):
    home = make_queue(tmp_path)
    held = _waiting(home, 104, T)
    waiting = _waiting(home, 105, T + 10**6)
    dq = DirQueue(home)
    dq.startup()
    dq.due(T)                                       # 104 is now the caller's
    dq.run_all_now()
    entries = dq.due(dq.next_wakeup())
    assert [(e.n, e.channel) for e in entries] == [(105, "remote")]
    assert entries[0].due < T + 10**6
    dq.reschedule(105, "remote", T + 500)
    dq.save_schedule([(104, "remote", T + 7)])      # what the caller still holds, and its own
    assert os.stat(held).st_mtime == T + 7
    assert os.stat(waiting).st_mtime == T + 500


def test_take_removes_a_message_at_once_and_the_heaps_stay_bounded():
    """A command on message n (send/commands.py) takes its entries out in O(1): they are
    never handed out, a new entry for the same number is, and taken entries do not pile up."""
    from qmailpy.backends.base import Scheduled
    from qmailpy.backends.dir.schedule import DirSchedule
    s = DirSchedule()
    for n in range(1, 5001):
        s.add(Scheduled(n, "remote", T + n))
    s.add(Scheduled(7, "local", T + 7))
    assert _offered(s.take(7)) == [(7, "local", T + 7), (7, "remote", T + 7)]
    assert s.take(7) == []
    for n in range(8, 4008):
        s.take(n)
    assert sum(len(h) for h in s.heaps.values()) < 2 * len(s.index) + 1100
    s.add(Scheduled(9, "remote", T + 1))                 # the number reused by a new message
    assert s.next_wakeup(T) == T + 1
    got = _offered(s.due(T + 10**6, rescan=None))
    assert [e[0] for e in got] == [1, 2, 3, 4, 5, 6, 9] + list(range(4008, 5001))
    assert len(s) == 0 and s.next_wakeup(T) is None
