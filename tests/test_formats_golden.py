"""Queue file bytes written out by hand from the format descriptions in docs/, compared with what qmailpy writes.

Every expected value below is typed from docs/queue-format.md "Queue directory layout"; docs/queue-format.md "File formats" or from
real notqmail files (shared/data/qmail-queue-snapshot.txt), never produced by
our own writers.
"""
import calendar
import os
import re
import subprocess
import time

import pytest

from qmailpy import envelope, layout

from shared_data import data_file

SNAPSHOT = data_file("qmail-queue-snapshot.txt")
needs_snapshot = pytest.mark.skipif(SNAPSHOT is None, reason="shared/data is not reachable")


# --- mess/S/n ----------------------------------------------------------------

def test_date822_example_from_the_spec():
    when = calendar.timegm((2024, 1, 5, 9, 3, 7, 0, 0, 0))
    assert envelope.date822(when) == b"5 Jan 2024 09:03:07 -0000"


def test_mess_file_is_received_line_plus_message(qmail_home):
    message = b"From: a@b\nSubject: golden\n\nline 1\r\nbare\rcr\n\n.\nno final newline"
    env_r, env_w = os.pipe()
    before = int(time.time())
    proc = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=env_r, env=qmail_home.env)
    os.close(env_r)
    proc.stdin.write(message)
    proc.stdin.close()
    os.write(env_w, b"Fjoe@a.example\0Tfred@b.example\0\0")
    os.close(env_w)
    assert proc.wait(timeout=30) == 0
    after = int(time.time())
    messdir = os.path.join(qmail_home.queue, "mess")
    [(split, name)] = [(s, f) for s in os.listdir(messdir) for f in os.listdir(os.path.join(messdir, s))]
    data = open(os.path.join(messdir, split, name), "rb").read()
    months = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
    who = "by uid 0" if os.getuid() == 0 else "by alias"
    candidates = []
    for t in range(before, after + 1):
        g = time.gmtime(t)
        date = "%d %s %d %02d:%02d:%02d -0000" % (g.tm_mday, months[g.tm_mon - 1], g.tm_year,
                                                  g.tm_hour, g.tm_min, g.tm_sec)
        candidates.append(("Received: (qmail %d invoked %s); %s\n" % (proc.pid, who, date)).encode() + message)
    assert data in candidates
    # todo/n: u{uid}\0p{pid}\0F{sender}\0T{rcpt}\0, the envelope's final NUL not stored
    todo = open(os.path.join(qmail_home.queue, "todo", name), "rb").read()
    assert todo == ("u%d\0p%d\0Fjoe@a.example\0Tfred@b.example\0" % (os.getuid(), proc.pid)).encode()
    assert open(os.path.join(qmail_home.queue, "intd", name), "rb").read() == todo


# --- intd/ and todo/ ---------------------------------------------------------

def test_todo_example_from_the_spec():
    assert envelope.todo_bytes(1000, 4242, b"joe@a.example", [b"fred@b.example"]) == \
        b"u1000\x00p4242\x00Fjoe@a.example\x00Tfred@b.example\x00"
    todo = envelope.parse_todo(b"u1000\x00p4242\x00Fjoe@a.example\x00Tfred@b.example\x00")
    assert (todo.uid, todo.pid, todo.sender, todo.recipients) == (1000, 4242, b"joe@a.example", [b"fred@b.example"])


def test_todo_without_u_and_p_reads_as_zero():
    todo = envelope.parse_todo(b"F\x00Tx@y\x00")
    assert (todo.uid, todo.pid, todo.sender, todo.recipients) == (0, 0, b"", [b"x@y"])


def test_queue_envelope_bytes():
    assert envelope.queue_envelope(b"", []) == b"F\x00\x00"
    assert envelope.queue_envelope(b"a@b", [b"c@d", b"e"]) == b"Fa@b\x00Tc@d\x00Te\x00\x00"


# --- info/S/n ----------------------------------------------------------------

def test_info_bytes_match_notqmail():
    # snapshot: info/18/1491292  size 30, record "Fbench@localhost-test.example"
    data = b"Fbench@localhost-test.example\x00"
    assert len(data) == 30
    assert envelope.info_bytes(b"bench@localhost-test.example") == data
    assert envelope.parse_info(data) == b"bench@localhost-test.example"
    assert envelope.info_bytes(b"") == b"F\x00"


# --- local/S/n and remote/S/n --------------------------------------------------

def test_channel_records_match_notqmail():
    # snapshot: remote/9/1492019  size 39: Dokc0@sink.example, Tcm0@closed.example
    data = b"Dokc0@sink.example\x00Tcm0@closed.example\x00"
    assert len(data) == 39
    records = envelope.parse_channel(data)
    assert [(r.offset, r.done, r.address) for r in records] == \
        [(0, True, b"okc0@sink.example"), (19, False, b"cm0@closed.example")]
    assert envelope.channel_bytes([b"okc0@sink.example", b"cm0@closed.example"]) == \
        b"Tokc0@sink.example\x00Tcm0@closed.example\x00"


def test_marking_done_is_one_byte_at_the_record_offset(tmp_path):
    path = tmp_path / "remote"
    path.write_bytes(b"Ta@x\x00Tbb@y\x00")
    record = envelope.parse_channel(path.read_bytes())[1]
    fd = os.open(str(path), os.O_WRONLY)
    os.pwrite(fd, b"D", record.offset)
    os.close(fd)
    assert path.read_bytes() == b"Ta@x\x00Dbb@y\x00"


# --- bounce/n ----------------------------------------------------------------

@pytest.mark.parametrize("addr, text, expected", [
    (b"a@b", b"Sorry, no mailbox here by that name. (#5.1.1)\n",
     b"<a@b>:\nSorry, no mailbox here by that name. (#5.1.1)\n\n"),
    (b"a@b", b"no final newline", b"<a@b>:\nno final newline\n\n"),
    (b"a@b", b"one\n\ntwo\n", b"<a@b>:\none\n/two\n\n"),
    (b"a@b", b"one\n\n\ntwo\n\n", b"<a@b>:\none\n//two\n\n\n"),
    (b"x\ny@b", b"t\n", b"<x_y@b>:\nt\n\n"),
    (b"a@b", b"", b"<a@b>:\n\n"),
])
def test_bounce_note(addr, text, expected):
    assert envelope.bounce_note(addr, text) == expected


# --- inode -> split directory ------------------------------------------------------

@needs_snapshot
def test_split_mapping_matches_notqmail_paths():
    paths = re.findall(r"^/var/qmail/queue/(mess|info|remote)/(\d+)/(\d+)$",
                       open(SNAPSHOT, encoding="utf-8").read(), re.M)
    assert len(paths) == 63
    for kind, split, n in paths:
        assert layout.relpath(kind, int(n)) == "%s/%s/%s" % (kind, split, n)
    assert layout.relpath("mess", 457) == "mess/20/457"
    assert layout.relpath("todo", 457) == "todo/457"
    assert layout.relpath("bounce", 457) == "bounce/457"


@pytest.mark.slow
def test_qmail_queue_names_mess_by_inode(qmail_home):
    for i in range(5):
        assert qmail_home.queue_message(b"m\n", b"a@b", [b"c@d"]).returncode == 0
    messdir = os.path.join(qmail_home.queue, "mess")
    found = 0
    for split in os.listdir(messdir):
        for name in os.listdir(os.path.join(messdir, split)):
            st = os.stat(os.path.join(messdir, split, name))
            assert st.st_ino == int(name) and int(name) % 23 == int(split)
            assert os.stat(os.path.join(qmail_home.queue, "todo", name)).st_size > 0
            found += 1
    assert found == 5


@pytest.mark.slow
def test_preprocessing_writes_info_local_remote_as_the_spec_gives_them(qmail_home):
    """The files qmail-send's preprocessing (DirQueue) writes, against bytes typed from
    docs/queue-format.md "File formats": info `F<sender>\\0`, local/remote one `T<addr>\\0` per recipient."""
    from qmailpy.backends.dir.queue import DirQueue

    class Unlinker:                                   # qmail-clean's answer to a todo/ request
        def request(self, name):
            os.unlink(os.path.join(qmail_home.queue, name))
            return b"+"

    rcpts = [b"a@test.example", b"x@far.example", b"b@test.example", b"y@far.example"]
    assert qmail_home.queue_message(b"m\n", b"joe@a.example", rcpts).returncode == 0
    dq = DirQueue(qmail_home.path, cleaner=Unlinker())
    [n] = dq.new_work()
    dq.preprocess(n, lambda a: ("local" if a.endswith(b"@test.example") else "remote", a))
    s = n % 23

    def read(kind):
        with open(os.path.join(qmail_home.queue, kind, str(s), str(n)), "rb") as f:
            return f.read()
    assert read("info") == b"Fjoe@a.example\0"
    assert read("local") == b"Ta@test.example\0Tb@test.example\0"
    assert read("remote") == b"Tx@far.example\0Ty@far.example\0"
    assert not os.path.exists(os.path.join(qmail_home.queue, "todo", str(n)))
