"""Channel and bounce files that outlived their message (directory backend).

qmail ends a message by unlinking its channel files, then its bounce file, then
info/, none of it fsync'd. A disk that keeps the order of name operations never
shows a channel or bounce file without info/, but after a power cut a disk may keep
info's removal and lose another (found by tests/test_crash_states.py). Such an
orphan must neither stay in the queue for good nor reach a new message that reuses
the number: its recipients or bounce notes would be the old message's.
"""
import os
import re

import pytest

from qmailpy.layout import relpath

pytestmark = [pytest.mark.slow, pytest.mark.dir_only]


def put(home, rel, data):
    path = os.path.join(home.queue, rel)
    with open(path, "wb") as f:
        f.write(data)
    if os.geteuid() == 0:
        st = os.stat(os.path.dirname(path))
        os.chown(path, st.st_uid, st.st_gid)
    return path


@pytest.mark.parametrize("body_left", [False, True], ids=["body-gone", "body-left"])
def test_orphans_of_an_ended_message_are_removed_at_startup(qmail_home, users, daemons, body_left):
    users.add("a")
    n = 999_999_937                         # no message has this number
    if body_left:                           # cut before qmail-clean removed mess/ too
        put(qmail_home, relpath("mess", n), b"Subject: old\n\nold\n")
    orphans = [put(qmail_home, relpath(kind, n), data) for kind, data in (
        ("local", b"DTa@test.example\0"), ("remote", b"DTx@far.example\0"),
        ("bounce", b"Pold@far.example\0Aold reason\0"))]
    daemons.start()
    for kind in ("local", "remote", "bounce"):
        daemons.wait_line(r"^warning: removed %s left over from an ended message$" % relpath(kind, n))
    assert not any(os.path.exists(p) for p in orphans)


def test_a_new_message_does_not_inherit_an_old_bounce_file(qmail_home, users, daemons):
    users.add("joe")
    done = qmail_home.queue_message(b"Subject: new\n\nnew message\n", b"joe@test.example",
                                    [b"nosuch@test.example"])
    assert done.returncode == 0
    (name,) = os.listdir(os.path.join(qmail_home.queue, "todo"))
    n = int(name)
    # What a power cut can leave of an earlier message with the same number.
    put(qmail_home, relpath("bounce", n), b"Pold@far.example\0Aan old failure\0")
    daemons.start()
    daemons.wait_line(r"^warning: removed bounce/%d left over from an earlier message %d$" % (n, n))
    daemons.wait_line(r"^bounce msg %d " % n)
    daemons.wait_line(r"^end msg ", 2)
    md = os.path.join(users.base, "joe", "Maildir", "new")
    (bounce,) = os.listdir(md)
    with open(os.path.join(md, bounce), "rb") as f:
        text = f.read()
    assert b"<nosuch@test.example>:" in text
    assert b"old@far.example" not in text and b"an old failure" not in text


@pytest.mark.parametrize("todo_left", [False, True], ids=["preprocessed", "todo-left"])
def test_a_message_whose_body_is_gone_is_ended_at_startup(qmail_home, users, daemons, todo_left):
    """The state a power cut left in tests/test_crash_states.py: qmail-clean's removal of
    mess/S/n was kept (a later message synced mess/S/) while the earlier removals of
    info/, the channel files and perhaps todo/ were lost. Delivering again would only
    defer for good (there is no body); every delivery was already made."""
    users.add("a")
    n = 999_999_929
    mess_rel = relpath("mess", n)
    left = [put(qmail_home, relpath(kind, n), data) for kind, data in (
        ("info", b"Fold@far.example\0"), ("local", b"DTa@test.example\0TTa@test.example\0"),
        ("bounce", b"Pold@far.example\0Aold reason\0"))]
    os.utime(left[0], (1_700_000_000, 1_700_000_000))
    left.append(put(qmail_home, relpath("hold", n), b"1700000000\n"))     # it was held
    if todo_left:
        left.append(put(qmail_home, relpath("todo", n), b"u0\0p1\0Fold@far.example\0Ta@test.example\0\0"))
    daemons.start()
    for kind in ("local", "bounce", "info", "hold"):
        daemons.wait_line(r"^warning: removed %s left over from an ended message \(no %s\)$"
                          % (relpath(kind, n), mess_rel))
    if todo_left:
        daemons.wait_line(r"^warning: removed todo/%d left over from an ended message \(no %s\)$"
                          % (n, mess_rel))
    done = qmail_home.queue_message(b"Subject: after\n\nafter\n", b"b@test.example", [b"a@test.example"])
    assert done.returncode == 0
    daemons.wait_line(r"^end msg ")
    assert not any(os.path.exists(p) for p in left)
    md = os.path.join(users.base, "a", "Maildir", "new")
    (only,) = os.listdir(md)                 # the new message; nothing of the old one
    with open(os.path.join(md, only), "rb") as f:
        assert b"Subject: after" in f.read()
    assert not any(re.search(r"starting delivery \d+: msg %d " % n, line) for line in daemons.lines())
