"""A full disk: nothing accepted is lost, nothing refused is half-queued (root only:
the home, or a user's Maildir, lives on its own small tmpfs).

qmail-queue exits 53 ("qq write error or disk full") with nothing in todo/ (or no
envelope record in the log); qmail-smtpd answers 451; on the log backend a record
torn by ENOSPC in the middle of an append is cut off by the next appender, never
trusted; a Maildir on a full file system defers; after space returns, everything
that was accepted is delivered, once. qmail-send working on while the queue's file
system is full (its preprocessing, or the records of its delivery results, failing)
delivers every accepted message once space returns, a duplicate allowed where a
result could not be recorded, and leaves nothing stuck in the queue.
"""
import os
import signal
import struct
import subprocess
import tempfile
import time

import pytest

from conftest import AS_ROOT, make_home
from delivery_support import maildir_messages, wait_maildir
from lspawn_harness import LocalUsers
from send_harness import Daemons
from smtpd_support import SmtpdProcess

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not AS_ROOT, reason="mounting a tmpfs needs root"),
              pytest.mark.both_backends]

PAGE = 4096


@pytest.fixture
def small_fs():
    """A fresh 16 MiB tmpfs, traversable by the test home's account."""
    base = tempfile.mkdtemp(prefix="qmailpy-full-")
    os.chmod(base, 0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", base], check=True)
    try:
        yield base
    finally:
        subprocess.run(["umount", "-l", base], check=False)
        os.rmdir(base)


def fill(fs, leave_pages=0):
    """Fill fs with a file of zeros until ENOSPC, then give back leave_pages pages; its path."""
    path = os.path.join(fs, "filler")
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
        while True:         # the last, smaller pieces
            try:
                f.write(b"\0" * PAGE)
            except OSError:
                break
    if leave_pages:
        os.truncate(path, max(0, os.path.getsize(path) - leave_pages * PAGE))
    return path


def queue(home, message, recipients):
    return home.queue_message(message, b"joe@test.example", recipients)


def queued_count(home):
    """"messages in queue" as qmail-qstat counts them (either backend, preprocessed or not)."""
    done = home.run(["qmail-qstat"])
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(b"messages in queue: "), done.stdout
    return int(first.split(b": ")[1])


def todo_files(home):
    todo = os.path.join(home.queue, "todo")
    return [n for _, _, names in os.walk(todo) for n in names] if os.path.isdir(todo) else []


@pytest.fixture
def full_home(small_fs, queue_backend):
    home = make_home(small_fs, queue_backend)
    home.users = LocalUsers(home)
    home.bench = home.users.add("bench")
    return home


def test_qmail_queue_on_a_full_disk_exits_53_and_queues_nothing(full_home):
    home = full_home
    first = queue(home, b"Subject: before\n\nkept\n", [b"bench@test.example"])
    assert first.returncode == 0, first.stderr
    filler = fill(os.path.dirname(home.path))
    refused = queue(home, b"Subject: full\n\n" + b"x" * 200000 + b"\n", [b"bench@test.example"])
    assert refused.returncode == 53, refused.stderr
    assert queued_count(home) == 1
    if home.backend == "dir":
        assert len(todo_files(home)) == 1
    os.unlink(filler)
    after = queue(home, b"Subject: after\n\nkept too\n", [b"bench@test.example"])
    assert after.returncode == 0, after.stderr
    daemons = Daemons(home).start()
    try:
        got = wait_maildir(os.path.join(home.bench, "Maildir"), 2)
        daemons.wait_line(r"^end msg ", 2)
    finally:
        daemons.kill()
    subjects = sorted(m.split(b"Subject: ")[1].split(b"\n")[0] for m in got)
    assert subjects == [b"after", b"before"]


def test_a_log_record_torn_by_enospc_is_cut_off_not_trusted(full_home):
    """The body fits in the one page left, the envelope record does not: pwrite writes
    part of it, then fails. qmail-queue exits 53; the next appender cuts the torn bytes."""
    home = full_home
    if home.backend != "log":
        pytest.skip("the log backend's appends")
    first = queue(home, b"Subject: before\n\nkept\n", [b"bench@test.example"])
    assert first.returncode == 0, first.stderr
    filler = fill(os.path.dirname(home.path), leave_pages=1)
    many = [b"bench-%04d-padding-to-make-a-long-envelope@test.example" % i for i in range(300)]
    refused = queue(home, b"Subject: torn\n\nsmall body\n", many)
    assert refused.returncode == 53, refused.stderr
    head, end = struct.unpack("<QQ", open(os.path.join(home.queue, "log", "commit"), "rb").read(16))
    segment = os.path.join(home.queue, "log", "%010d.seg" % head)
    assert os.path.getsize(segment) > end        # the torn part of the record is there
    os.unlink(filler)
    after = queue(home, b"Subject: after\n\nkept too\n", [b"bench@test.example"])
    assert after.returncode == 0, after.stderr
    assert queued_count(home) == 2
    daemons = Daemons(home).start()
    try:
        got = wait_maildir(os.path.join(home.bench, "Maildir"), 2)
        daemons.wait_line(r"^end msg ", 2)
        assert not any("corrupt" in line for line in daemons.lines())
    finally:
        daemons.kill()
    subjects = sorted(m.split(b"Subject: ")[1].split(b"\n")[0] for m in got)
    assert subjects == [b"after", b"before"]


def test_qmail_smtpd_answers_451_on_a_full_disk(full_home):
    home = full_home
    filler = fill(os.path.dirname(home.path))
    with SmtpdProcess(home) as s:
        assert s.reply().startswith(b"220 ")
        s.command(b"HELO client.example\r\n")
        assert s.command(b"MAIL FROM:<a@b.example>\r\n").startswith(b"250")
        assert s.command(b"RCPT TO:<bench@test.example>\r\n").startswith(b"250")
        assert s.command(b"DATA\r\n").startswith(b"354")
        s.send(b"Subject: full\r\n\r\n" + b"y" * 100000 + b"\r\n")
        assert s.command(b".\r\n") == b"451 qq write error or disk full (#4.3.0)\r\n"
    os.unlink(filler)
    assert queued_count(home) == 0
    assert todo_files(home) == []


def test_a_maildir_on_a_full_file_system_defers_then_delivers(small_fs, qmail_home, users):
    """The recipient's Maildir is on the full tmpfs, the queue is not."""
    home = qmail_home
    user_home = users.mkdir(os.path.join(small_fs, "bench"), 0o755)
    users.maildir(os.path.join(user_home, "Maildir"))
    users.add("bench", home=user_home)
    filler = fill(small_fs)
    queue(home, b"Subject: deferred\n\n" + b"z" * 50000 + b"\n", [b"bench@test.example"])
    daemons = Daemons(home).start()
    try:
        lines = daemons.wait_line(r"^delivery \d+: deferral: ")
        deferral = [l for l in lines if ": deferral: " in l][0]
        assert deferral.endswith(": deferral: Temporary_error_on_maildir_delivery._(#4.3.0)/"), deferral
        assert maildir_messages(os.path.join(user_home, "Maildir")) == []
        os.unlink(filler)
        daemons.signal(signal.SIGALRM)       # qmailctl doqueue
        got = wait_maildir(os.path.join(user_home, "Maildir"), 1)
        daemons.wait_line(r"^end msg ")
    finally:
        daemons.kill()
    assert len(got) == 1 and got[0].endswith(b"z" * 50000 + b"\n")


@pytest.mark.parametrize("when", ["before preprocessing", "during deliveries"])
def test_qmail_send_running_on_a_full_queue_loses_nothing(small_fs, queue_backend, tmp_path, when):
    """qmail-send works on while the queue's file system is full (the Maildir and its own
    log are elsewhere): its preprocessing, or the records of delivery results, fail.
    Once space returns and doqueue is sent, every accepted message is delivered."""
    from conftest import traversable_base
    home = make_home(small_fs, queue_backend)
    users = LocalUsers(home)
    elsewhere = traversable_base(tmp_path)
    user_home = users.mkdir(os.path.join(elsewhere, "carol"), 0o755)
    maildir = users.maildir(os.path.join(user_home, "Maildir"))
    users.add("carol", home=user_home)
    if when == "during deliveries":            # each delivery takes 2 s before the Maildir
        users.dotqmail(user_home, "", "|sleep 2\n./Maildir/\n")
    work = users.mkdir(os.path.join(elsewhere, "work"), 0o777)
    os.symlink(work, os.path.join(small_fs, "work"))          # qmail-send's log, off the full fs
    count = 20
    accepted = set()
    for i in range(count):
        assert queue(home, b"Subject: %d\n\nbefore\n" % i, [b"carol@test.example"]).returncode == 0
        accepted.add(i)
    filler = None
    if when == "before preprocessing":
        filler = fill(small_fs)
    daemons = Daemons(home).start()
    try:
        daemons.wait_started()
        if when == "during deliveries":
            daemons.wait_line(r"^starting delivery ", 10)
            filler = fill(small_fs)
        start = daemons.offset_of_start

        def full_disk_met(lines):       # it failed on the full disk, or it got through every delivery
            since = lines[start:]
            return (any(l.startswith("warning: ") for l in since)
                    or sum(1 for l in since if l.startswith("delivery ")) >= count)
        daemons.wait_for(full_disk_met, 60, "a warning on the full disk or every delivery's result")
        os.unlink(filler)
        deadline = time.monotonic() + 120
        while queued_count(home):
            assert time.monotonic() < deadline, home.run(["qmail-qread"]).stdout
            seen = daemons.line_count()
            daemons.signal(signal.SIGALRM)           # qmailctl doqueue
            try:                                     # until qmail-send has acted on it
                daemons.wait_for(lambda lines: len(lines) > seen, 2, "a line after doqueue")
            except AssertionError:
                pass                                 # nothing to retry yet: ask again
        got = maildir_messages(maildir)             # delivered before its message left the queue
        lines = daemons.lines()
    finally:
        daemons.kill()
    subjects = [int(m.split(b"Subject: ")[1].split(b"\n")[0]) for m in got]
    print("%s: %d warnings, %d accepted, %d deliveries of %d messages" % (
        when, sum(1 for line in lines if line.startswith("warning: ")), len(accepted),
        len(subjects), len(set(subjects))))
    assert accepted <= set(subjects)
    # nothing stuck: before the fix the log backend offered a message whose REPLACEMENT
    # could not be written again and again ("trouble opening local/...") for ever
    left = home.run(["qmail-qread"]).stdout
    assert queued_count(home) == 0, left
