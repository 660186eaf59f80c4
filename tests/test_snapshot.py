"""qmailctl snapshot: the queue walk, the snapshot format, the notqmail dump reader."""
import json
import os
import subprocess
import sys

import pytest

from qmailpy import layout, states
from qmailpy import snapshot_format as snapshot

from shared_data import data_file

DUMP = data_file("qmail-queue-snapshot.txt")
BIN = os.path.dirname(sys.executable)


def _queue(tmp_path):
    """A home with an empty directory queue (every split subdirectory present)."""
    home = tmp_path / "home"
    queue = home / "queue"
    for kind in layout.SPLIT_DIRS:
        for s in range(layout.SPLIT):
            (queue / kind / str(s)).mkdir(parents=True)
    for kind in ("pid", "intd", "todo", "bounce", "lock"):
        (queue / kind).mkdir(parents=True)
    (home / "control").mkdir()
    return home, queue


def _mess(queue, body=b"Received: x\n\nhi\n", split_of=None):
    """Create a mess file the way qmail-queue does: its number is its inode."""
    scratch = queue / "pid" / "scratch"
    scratch.write_bytes(body)
    n = os.stat(scratch).st_ino
    s = layout.split_of(n) if split_of is None else split_of
    os.link(scratch, queue / "mess" / str(s) / str(n))
    os.unlink(scratch)
    return n


def _snapshot(home, *extra):
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run([os.path.join(BIN, "qmailctl"), "snapshot", "--home", str(home),
                           "--host", "mx7"] + list(extra), capture_output=True, env=env,
                          timeout=60)
    return proc


def _records(text):
    records, errors = snapshot.read(text.splitlines())
    assert errors == []
    return records


def test_snapshot_of_a_directory_queue(tmp_path):
    home, queue = _queue(tmp_path)
    (home / "control" / "queuelifetime").write_text("3600\n")
    # S5: preprocessed, one local recipient done, one remote pending, a bounce note
    n5 = _mess(queue)
    (queue / layout.relpath("info", n5)).write_bytes(b"Fjoe@a.example\0")
    os.utime(queue / layout.relpath("info", n5), (1795000000, 1795000000))
    (queue / layout.relpath("local", n5)).write_bytes(b"Dme@here\0")
    (queue / layout.relpath("remote", n5)).write_bytes(b"Tyou@there\0Dhim@there\0")
    (queue / "bounce" / str(n5)).write_bytes(b"<me@here>:\nno mailbox\n\n")
    # S4: queued, not preprocessed
    n4 = _mess(queue)
    (queue / "intd" / str(n4)).write_bytes(b"u0\0p42\0Fs@x\0Tr@y\0")
    os.link(queue / "intd" / str(n4), queue / "todo" / str(n4))
    # S2 leftover, and an S3
    n2 = _mess(queue)
    n3 = _mess(queue)
    (queue / "intd" / str(n3)).write_bytes(b"u0\0p42\0F")
    # files that disagree: todo without mess, and a mess in the wrong split directory
    (queue / "todo" / "77").write_bytes(b"u0\0p1\0Fa@b\0Tc@d\0")
    wrong = _mess(queue, split_of=None)
    os.rename(queue / layout.relpath("mess", wrong),
              queue / "mess" / str((wrong + 1) % 23) / str(wrong))
    (queue / "mess" / "3" / "not-a-number").write_bytes(b"ignored")

    proc = _snapshot(home)
    assert proc.returncode == 0, proc.stderr
    records = _records(proc.stdout.decode())
    head, body, tail = records[0], records[1:-1], records[-1]
    assert head["record"] == "snapshot" and head["host"] == "mx7"
    assert head["queuelifetime"] == 3600 and head["backend"] == "dir"
    assert tail == {"record": "end", "host": "mx7", "messages": len(body)}
    by_n = {r["n"]: r for r in body}
    assert set(by_n) == {n5, n4, n2, n3, 77, wrong}
    r5 = by_n[n5]
    assert r5["state"] == states.S5 and r5["sender"] == "joe@a.example"
    assert r5["birth"] == 1795000000 and r5["bouncing"] is True
    assert r5["bounce"] == "<me@here>:\nno mailbox\n\n"
    assert r5["recipients"] == [
        {"channel": "local", "address": "me@here", "done": True},
        {"channel": "remote", "address": "you@there", "done": False},
        {"channel": "remote", "address": "him@there", "done": True}]
    assert r5["files"]["mess"]["inode"] == n5
    assert r5["files"]["mess"]["path"] == layout.relpath("mess", n5)
    assert r5["size"] == len(b"Received: x\n\nhi\n")
    assert by_n[n4]["state"] == states.S4
    assert by_n[n4]["recipients"] == [{"channel": "todo", "address": "r@y", "done": False}]
    assert by_n[n2]["state"] == states.S2 and by_n[n3]["state"] == states.S3
    assert by_n[77]["state"] is None
    assert any(p.startswith("split-mismatch") for p in by_n[wrong]["problems"])
    assert by_n[n5]["problems"] == []


def test_snapshot_to_a_file_and_errors(tmp_path):
    home, queue = _queue(tmp_path)
    _mess(queue)
    out = tmp_path / "snap.jsonl"
    proc = _snapshot(home, "--out", str(out))
    assert proc.returncode == 0 and proc.stdout == b""
    records = _records(out.read_text())
    assert [r["record"] for r in records] == ["snapshot", "message", "end"]
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]
    proc = _snapshot(tmp_path / "nowhere")
    assert proc.returncode == 111
    assert b"qmailctl snapshot:" in proc.stderr and b"Traceback" not in proc.stderr


@pytest.mark.skipif(DUMP is None, reason="shared/data is not reachable")
def test_the_notqmail_dump_converts_to_the_same_records(tmp_path):
    with open(DUMP) as f:
        records = list(snapshot.from_notqmail_text(f, "mx"))
    head, body, tail = records[0], records[1:-1], records[-1]
    assert head["taken"] == 1795323299.654731 and tail["messages"] == 21 == len(body)
    assert all(r["state"] == states.S5 for r in body)
    by_n = {r["n"]: r for r in body}
    r = by_n[1492019]
    assert r["birth"] == 1795323205 and r["size"] == 884
    assert r["sender"] == "bench@localhost-test.example"
    assert r["recipients"] == [
        {"channel": "remote", "address": "okc0@sink.example", "done": True},
        {"channel": "remote", "address": "cm0@closed.example", "done": False}]
    assert r["files"]["remote"]["mtime"] == 1795324045
    done = sum(1 for r in body for x in r["recipients"] if x["done"])
    assert done == 3
    # every line round-trips through the reader the audit uses
    text = "".join(snapshot.dumps(r) + "\n" for r in records)
    again, errors = snapshot.read(text.splitlines())
    assert errors == [] and again == json.loads("[" + ",".join(text.splitlines()) + "]")
    proc = subprocess.run([os.path.join(BIN, "qmailctl"), "snapshot", "--from-notqmail", DUMP,
                           "--host", "mx"], capture_output=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.decode() == text


def test_corrupt_lines_are_named():
    good = snapshot.dumps(snapshot.trailer("h", 0))
    records, errors = snapshot.read([good, "{not json", '{"record": "message", "n": 5}',
                                     '{"record": "snapshot", "format": 99, "host": "h", '
                                     '"taken": 1, "queuelifetime": 5}', "[1, 2]"])
    assert len(records) == 1
    assert [e[0] for e in errors] == [2, 3, 4, 5]
    assert "not JSON" in errors[0][1] and "format" in errors[2][1]
    with pytest.raises(snapshot.SnapshotError):
        list(snapshot.from_notqmail_text(["hello\n"], "h"))


def test_wrongly_typed_nested_fields_are_errors_not_records():
    files = {"mess": {"path": "mess/5/5", "split": 5, "size": 10, "mtime": 1.5, "atime": None,
                      "inode": 5, "mode": 0o644, "links": 1}}
    good = snapshot.message_record("h", 5, "dir", files, "a@b",
                                   [snapshot.recipient("remote", "c@d", False)])
    assert snapshot.parse_line(snapshot.dumps(good)) == good

    def broken(**changes):
        rec = json.loads(snapshot.dumps(good))
        for key, value in changes.items():
            rec[key] = value
        return snapshot.dumps(rec)

    cases = [broken(recipients=[1]), broken(recipients=[{"channel": "remote", "done": "no",
                                                         "address": "c@d"}]),
             broken(problems=[7]), broken(birth="yesterday"), broken(size=True),
             broken(files={"mess": dict(files["mess"], mtime="noon")}),
             broken(files={"mess": dict(files["mess"], inode=[5])})]
    records, errors = snapshot.read([snapshot.dumps(good)] + cases)
    assert records == [good]
    assert [number for number, _text in errors] == list(range(2, 2 + len(cases)))
    assert errors[0][1] == "message record: recipient 1 is not {channel, address, done}"
    assert errors[2][1] == "message record: problem 1 is not a string"
    assert errors[5][1] == "message record: file mess: field 'mtime' of the wrong type"


def test_log_backend_home_uses_the_backend_interface(tmp_path):
    pytest.importorskip("qmailpy.backends.log.queue")
    home, queue = _queue(tmp_path)
    (home / "control" / "queuebackend").write_text("log\n")
    (queue / "log").mkdir()
    proc = _snapshot(home)
    assert proc.returncode == 0, proc.stderr
    records = _records(proc.stdout.decode())
    assert records[0]["backend"] == "log"
    assert records[-1]["messages"] == len(records) - 2


def test_message_id_is_read_from_the_mess_header_within_its_limit(tmp_path):
    home, queue = _queue(tmp_path)
    folded = _mess(queue, b"Received: x\nMessage-Id:\n\t<a.1@mx7.example>\nSubject: s\n\n"
                          b"Message-ID: <in-the-body@x>\n")
    bodyonly = _mess(queue, b"Subject: s\n\nMessage-ID: <in-the-body@x>\n")
    filler = b"".join(b"X-Filler: %060d\n" % i for i in range(snapshot.HEADER_LIMIT // 70))
    beyond = _mess(queue, filler + b"Message-ID: <far@x>\n\nhi\n")
    proc = _snapshot(home)
    assert proc.returncode == 0, proc.stderr
    by_n = {r["n"]: r for r in _records(proc.stdout.decode())[1:-1]}
    assert by_n[folded]["message_id"] == "<a.1@mx7.example>"
    assert by_n[bodyonly]["message_id"] is None
    assert by_n[beyond]["message_id"] is None and by_n[beyond]["problems"] == []
