"""qmail-qread and qmail-qstat against real notqmail output (shared/data, found by shared_data.py) and our own queue."""
import calendar
import os
import re
import time

import pytest

from shared_data import data_file

pytestmark = pytest.mark.slow

SNAPSHOT = data_file("qmail-queue-snapshot.txt")
needs_snapshot = pytest.mark.skipif(SNAPSHOT is None, reason="shared/data is not reachable")


def write(home, rel, data, mtime=None):
    path = os.path.join(home.queue, rel)
    with open(path, "wb") as f:
        f.write(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    if os.geteuid() == 0:
        os.chown(path, home.uid, home.gid)


def snapshot():
    """(qread output, qstat output, {rel path: (bytes, mtime)}) from the notqmail snapshot."""
    text = open(SNAPSHOT, encoding="utf-8").read()
    qstat = text.split("## 2a.")[1].split("\n", 1)[1].split("\n## ")[0].strip("\n") + "\n"
    qread = text.split("## 2b.")[1].split("\n", 1)[1].split("\n## ")[0].strip("\n") + "\n"
    files = {}
    current = None
    for line in text.split("## 3.")[1].splitlines():
        m = re.match(r"  ((?:mess|info|remote|local)/\d+/\d+)  size (\d+)  mtime (\d+)", line)
        if m:
            current = m.group(1)
            size, mtime = int(m.group(2)), int(m.group(3))
            files[current] = [b"x" * size if current.startswith("mess/") else b"", mtime]
            continue
        m = re.match(r"    ([FTD].*)$", line)
        if m and current and not current.startswith("mess/"):
            files[current][0] += m.group(1).encode() + b"\0"
    return qread, qstat, files


def blocks(output):
    """qmail-qread output split into one block per message, in order."""
    out, block = [], []
    for line in output.splitlines(keepends=True):
        if not line.startswith(("\t", "  done")) and block:
            out.append("".join(block))
            block = []
        block.append(line)
    if block:
        out.append("".join(block))
    return out


@needs_snapshot
@pytest.mark.dir_only       # writes info/, local/, remote/ files itself
def test_qread_and_qstat_match_notqmail_on_its_own_queue(qmail_home):
    qread, qstat, files = snapshot()
    # The snapshot rounds mtimes to whole seconds, qmail-qread truncates them: take each
    # birth from qmail-qread's own line (it is within a second of the snapshot's).
    births = {}
    for m in re.finditer(r"^(\d+ \w+ \d+ \d+:\d+:\d+) GMT  #(\d+) ", qread, re.M):
        births[int(m.group(2))] = calendar.timegm(time.strptime(m.group(1), "%d %b %Y %H:%M:%S"))
    for rel, (data, mtime) in files.items():
        n = int(rel.split("/")[2])
        if rel.startswith("info/"):
            assert abs(births[n] - mtime) <= 1
            mtime = births[n]
        write(qmail_home, rel, data, mtime)
    got = qmail_home.run(["qmail-qread"])
    assert got.returncode == 0 and got.stderr == b""
    # Inside one split directory qmail lists in directory order, which depends on the filesystem.
    assert sorted(blocks(got.stdout.decode())) == sorted(blocks(qread))
    splits = [int(b.split("#")[1].split()[0]) % 23 for b in blocks(got.stdout.decode())]
    assert splits == sorted(splits)
    got = qmail_home.run(["qmail-qstat"])
    assert (got.returncode, got.stdout.decode()) == (0, qstat)


@pytest.mark.dir_only       # writes info/, local/, remote/ files itself
def test_qread_shows_bouncing_done_local_and_unprintables(qmail_home):
    n = 4711
    s = n % 23
    write(qmail_home, "mess/%d/%d" % (s, n), b"y" * 1234)
    write(qmail_home, "info/%d/%d" % (s, n), b"Fjoe\x01@a.example\0", 1704445387)   # 5 Jan 2024 09:03:07
    write(qmail_home, "local/%d/%d" % (s, n), b"Dme@test.example\0Tyou\xff@test.example\0")
    write(qmail_home, "remote/%d/%d" % (s, n), b"Tfar@b.example\0")
    write(qmail_home, "bounce/%d" % n, b"<me@test.example>:\nno\n\n")
    got = qmail_home.run(["qmail-qread"])
    assert got.returncode == 0
    assert got.stdout == (b"5 Jan 2024 09:03:07 GMT  #4711  1234  <joe_@a.example>  bouncing\n"
                          b"  done\tlocal\tme@test.example\n"
                          b"\tlocal\tyou_@test.example\n"
                          b"\tremote\tfar@b.example\n")


@pytest.mark.dir_only       # writes info/, local/, remote/ files itself
def test_qread_warns_about_a_message_it_cannot_read(qmail_home):
    write(qmail_home, "info/1/24", b"Fa@b\0", 1704445387)          # no mess/1/24
    got = qmail_home.run(["qmail-qread"])
    assert (got.returncode, got.stdout) == (0, b"warning: trouble with #24: file does not exist\n")


@pytest.mark.both_backends
def test_qstat_counts_queued_messages(qmail_home):
    for i in range(3):
        assert qmail_home.queue_message(b"m%d\n" % i, b"a@b", [b"c@d"]).returncode == 0
    got = qmail_home.run(["qmail-qstat"])
    assert got.stdout == b"messages in queue: 3\nmessages in queue but not yet preprocessed: 3\n"
    assert qmail_home.run(["qmail-qread"]).stdout == b""      # nothing preprocessed yet


@pytest.mark.both_backends
def test_missing_queue_is_fatal_111(qmail_home):
    env = dict(qmail_home.env, QMAILHOME=os.path.join(qmail_home.path, "nope"))
    for prog in ("qmail-qread", "qmail-qstat"):
        got = qmail_home.run([prog], env=env)
        assert got.returncode == 111
        assert got.stdout.startswith(b"fatal: unable to opendir ")


@pytest.mark.both_backends
@pytest.mark.parametrize("prog", ["qmail-qread", "qmail-qstat"])
def test_usage_error_is_100(qmail_home, prog):
    got = qmail_home.run([prog, "-x"])
    assert got.returncode == 100 and got.stderr.startswith(b"usage: ")


def test_qread_and_qstat_identical_after_convert_both_ways(qmail_home):
    """Real messages in several states on the directory backend, converted to the log
    backend and back: qmail-qread and qmail-qstat print the same bytes every time."""
    from send_harness import Daemons
    d = Daemons(qmail_home, fake=True)
    cases = [
        [b"defer1@far.example"],                                        # pending
        [b"ok@test.example", b"defer2@test.example", b"x@far.example"],  # partly done
        [b"fail@far.example", b"defer3@far.example"],                   # bouncing
        [b"defer4@test.example", b"defer5@far.example"],
    ] + [[b"defer-%d@far.example" % i] for i in range(12)]              # several splits
    try:
        d.start()
        d.wait_started()
        for i, rcpts in enumerate(cases):
            assert qmail_home.queue_message(b"Subject: %d\n\nbody\n" % i, b"s%d@x.example" % i,
                                            rcpts).returncode == 0
        deferrals = sum(1 for rcpts in cases for r in rcpts if b"defer" in r)
        d.wait_line(r"^delivery \d+: deferral: ", deferrals)
        d.wait_line(r"^delivery \d+: (success|failure): ", 3)
        assert d.stop() == 0
    finally:
        d.kill()
    # one more message that nobody preprocessed
    assert qmail_home.queue_message(b"late\n", b"late@x.example", [b"r@far.example"]).returncode == 0

    def outputs():
        qread, qstat = qmail_home.run(["qmail-qread"]), qmail_home.run(["qmail-qstat"])
        assert (qread.returncode, qread.stderr, qstat.returncode) == (0, b"", 0)
        return qread.stdout, qstat.stdout

    on_dir = outputs()
    listed = [int(b.split("#")[1].split()[0]) for b in blocks(on_dir[0].decode())]
    assert len(listed) == len(cases) and listed == sorted(listed, key=lambda n: (n % 23, n))
    assert b" bouncing\n" in on_dir[0] and b"  done\tlocal\tok@test.example\n" in on_dir[0]
    assert on_dir[1] == b"messages in queue: %d\nmessages in queue but not yet preprocessed: 1\n" % (
        len(cases) + 1)
    for backend in ("log", "dir"):
        done = qmail_home.run(["qmailctl", "convert", "--to", backend, "--quiet", "--home", qmail_home.path])
        assert done.returncode == 0, done.stderr
        with open(os.path.join(qmail_home.path, "control", "queuebackend")) as f:
            assert f.read().strip() == backend
        infos = sum(len(os.listdir(os.path.join(qmail_home.queue, "info", str(i)))) for i in range(23))
        assert infos == (0 if backend == "log" else len(cases))    # read from where it now lives
        assert outputs() == on_dir, backend
