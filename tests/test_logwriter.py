"""qmailctl's log writer (qmailpy/ctl/logwriter.py): stamped lines, rotated by size,
a fixed number of old files kept, nothing split or reordered."""
import os
import re
import subprocess
import sys

from qmailpy.logfiles import log_set

STAMPED = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z line (\d+) x+$")


def run_writer(path, lines, size, count, chunk=7):
    """Feed lines (bytes, no newline) through a real log writer in uneven pieces."""
    proc = subprocess.Popen([sys.executable, "-m", "qmailpy.ctl.logwriter", path, str(size), str(count)],
                            stdin=subprocess.PIPE)
    data = b"".join(line + b"\n" for line in lines)
    for i in range(0, len(data), chunk * 100 + 3):
        proc.stdin.write(data[i:i + chunk * 100 + 3])
        proc.stdin.flush()
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def numbers(paths):
    out = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        assert data.endswith(b"\n"), path
        for line in data.split(b"\n")[:-1]:
            m = STAMPED.match(line)
            assert m, line
            out.append(int(m.group(1)))
    return out


def test_rotates_by_size_and_keeps_the_newest_files(tmp_path):
    path = str(tmp_path / "qmail-send.log")
    lines = [b"line %d %s" % (i, b"x" * 60) for i in range(2000)]
    run_writer(path, lines, size=4096, count=3)
    files = log_set(str(tmp_path), "qmail-send.log")
    assert len(files) == 4 and files[-1] == path            # 3 rotated + the current one
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in files)
    assert all(os.path.getsize(p) <= 4096 for p in files)
    assert all(os.stat(p).st_mode & 0o777 == 0o640 for p in files)
    kept = numbers(files)
    # the newest lines, whole, in order, none twice: older ones went with the deleted files
    assert kept == list(range(kept[0], 2000)) and kept[0] > 0


def test_an_existing_log_is_appended_to_and_made_private(tmp_path):
    path = tmp_path / "qmail-send.log"
    path.write_bytes(b"2026-01-01T00:00:00.000000Z line 0 xx\n")
    os.chmod(path, 0o644)
    run_writer(str(path), [b"line 1 xx", b"line 2 xx"], size=1 << 20, count=2)
    assert numbers([str(path)]) == [0, 1, 2]
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert log_set(str(tmp_path), "qmail-send.log") == [str(path)]


def test_a_changed_logsize_counts_without_a_restart(tmp_path):
    """Started with the default limit (10 MB), the writer given the control directory
    rotates at control/logsize as soon as that file says 4096."""
    import time
    control = tmp_path / "control"
    control.mkdir()
    path = str(tmp_path / "qmail-send.log")
    proc = subprocess.Popen([sys.executable, "-m", "qmailpy.ctl.logwriter", path, str(10 * 1024 * 1024), "10",
                             str(control)], stdin=subprocess.PIPE)
    first = b"".join(b"line %d %s\n" % (i, b"x" * 60) for i in range(100))
    proc.stdin.write(first)
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not (os.path.exists(path) and os.path.getsize(path) >= 100 * 70):    # the writer took them
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (control / "logsize").write_text("4096\n")
    proc.stdin.write(b"".join(b"line %d %s\n" % (i, b"x" * 60) for i in range(100, 300)))
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    paths = log_set(str(tmp_path), "qmail-send.log")
    assert numbers(paths) == list(range(300))
    assert len(paths) >= 5
    assert all(os.path.getsize(p) <= 4096 for p in paths[1:])
