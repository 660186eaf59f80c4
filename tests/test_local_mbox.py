"""mbox delivery: locking against concurrent writers, >From quoting, truncate-back (docs/delivery.md "qmail-local")."""
import fcntl
import os
import resource
import subprocess
import sys

import pytest

from inotify_simple import INotify, flags


def big_message(tag, lines=20000):
    body = b"".join(b"%s line %05d From here\nFrom %s %05d\n>From %s\n" % (tag, i, tag, i, tag)
                    for i in range(lines))
    return b"Subject: " + tag + b"\n\n" + body


def quoted(message):
    out = []
    for line in message.split(b"\n")[:-1]:
        out.append((b">" if line.lstrip(b">").startswith(b"From ") else b"") + line + b"\n")
    return b"".join(out)


@pytest.mark.slow
def test_two_writers_at_once_do_not_interleave(users):
    home = users.add("mary", maildir=False)
    mbox = users.write(os.path.join(home, "Mailbox"), b"", 0o600)
    msg_a, msg_b = big_message(b"AAA"), big_message(b"BBB")
    mess = [users.mess(msg_a), users.mess(msg_b)]
    watch = INotify()
    watch.add_watch(mbox, flags.OPEN)
    holder = os.open(mbox, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)           # both writers must queue up behind us
    proc = users.start([users.command(0, mess[0], b"a@x.org", b"mary@test.example"),
                        users.command(1, mess[1], b"b@x.org", b"mary@test.example")],
                       defaultdelivery="./Mailbox")
    opened = 0
    while opened < 2:
        events = watch.read(timeout=30000)
        assert events, "qmail-local never opened the mbox"
        opened += len(events)
    fcntl.flock(holder, fcntl.LOCK_UN)
    os.close(holder)
    assert users.finish(proc) == {0: (b"K", b"did 1+0+0\n"), 1: (b"K", b"did 1+0+0\n")}
    with open(mbox, "rb") as f:
        data = f.read()
    entries = {}
    for sender, msg, delivered_to in ((b"a@x.org", msg_a, b"mary@test.example"),
                                      (b"b@x.org", msg_b, b"mary@test.example")):
        tail = (b"Return-Path: <" + sender + b">\nDelivered-To: " + delivered_to + b"\n"
                + quoted(msg) + b"\n")
        start = data.find(tail)
        assert start > 0, "a message is not in one piece"
        line_start = data.rfind(b"\n", 0, start - 1) + 1
        assert data[line_start:start].startswith(b"From " + sender + b" ")
        entries[line_start] = start + len(tail)
    # The two entries cover the file exactly, one after the other.
    first, second = sorted(entries)
    assert first == 0 and entries[first] == second and entries[second] == len(data)


def test_quoting_and_final_newline(users):
    home = users.add("nina", maildir=False)
    message = b"Subject: q\n\nFrom start\n>From one\n>>From two\nFromage\n From not\nlast"
    assert users.deliver(b"nina@test.example", message, sender=b"",
                         defaultdelivery="./Mailbox") == (b"K", b"did 1+0+0\n")
    with open(os.path.join(home, "Mailbox"), "rb") as f:
        data = f.read()
    assert data.split(b"\n", 1)[1] == (
        b"Return-Path: <>\nDelivered-To: nina@test.example\nSubject: q\n\n"
        b">From start\n>>From one\n>>>From two\nFromage\n From not\nlast\n\n")


def test_write_error_truncates_back(qmail_home, tmp_path):
    # qmail-local as a program with a file size limit: the second message cannot fit.
    home = tmp_path / "h"
    home.mkdir()
    os.chmod(home, 0o755)
    mbox = home / "Mailbox"
    before = b"From x Mon Jan 01 00:00:00 2024\nReturn-Path: <>\n\nold\n\n"
    mbox.write_bytes(before)
    msg = tmp_path / "msg"
    msg.write_bytes(big_message(b"CCC", lines=2000))

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 4096, len(before) + 4096))

    # -B: the limit would also truncate the .pyc files Python writes while importing.
    with open(msg, "rb") as stdin:
        done = subprocess.run([sys.executable, "-B", "-m", "qmailpy.cli.qmail_local", "--", "u",
                               str(home), "u", "", "", "test.example", "s@x", "./Mailbox"],
                              stdin=stdin, capture_output=True, env=qmail_home.env,
                              preexec_fn=limit, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        111, b"", b"Unable to write ./Mailbox: file too big. (#4.3.0)\n")
    assert mbox.read_bytes() == before


@pytest.mark.slow
def test_lock_held_too_long_is_temporary(tmp_path):
    # The 30-second limit, shortened: the same code path with lock_timeout=1.
    script = (
        "import os, sys\n"
        "from qmailpy.local import mbox\n"
        "from qmailpy.local.errors import Failure\n"
        "fd = os.open(sys.argv[2], os.O_RDONLY)\n"
        "try:\n"
        "    mbox.deliver(sys.argv[1].encode(), fd, b'U\\n', b'R\\n', b'D\\n', lock_timeout=1)\n"
        "except Failure as f:\n"
        "    sys.stdout.buffer.write(f.text); sys.exit(f.code)\n"
    )
    box = tmp_path / "box"
    box.write_bytes(b"")
    msg = tmp_path / "msg"
    msg.write_bytes(b"x\n")
    holder = os.open(box, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        done = subprocess.run([sys.executable, "-c", script, str(box), str(msg)],
                              capture_output=True, timeout=60)
    finally:
        os.close(holder)
    assert (done.returncode, done.stdout) == (
        111, b"File has been locked for 30 seconds straight. (#4.3.0)")
    assert box.read_bytes() == b""
