"""lock/tcpto (docs/delivery.md "tcpto logic"; docs/delivery.md "`lock/tcpto` format"): the table logic, and suppression after connect timeouts."""
import os
import socket
import struct
import time

import pytest

from qmailpy.remote.tcpto import Table
from remote_harness import ScriptedPeer, qmail_remote, route

IP = socket.inet_aton("127.0.0.1")


def make_table(tmp_path, data=None):
    path = tmp_path / "tcpto"
    path.write_bytes(bytes(1024) if data is None else data)
    return str(path)


def records(path):
    data = open(path, "rb").read()
    out = {}
    for i in range(0, len(data), 16):
        rec = data[i:i + 16]
        if rec[4]:
            out[socket.inet_ntoa(rec[:4])] = (i // 16, rec[4], struct.unpack_from("<I", rec, 8)[0])
        assert rec[5:8] == b"\0" * 3 and rec[12:16] == b"\0" * 4
    return out


def test_two_timeouts_suppress(tmp_path):
    path = make_table(tmp_path)
    clock = [100000]
    t = Table(path, now=lambda: clock[0], pid=0)
    assert not t.suppressed(IP)
    t.record(IP, True)
    assert records(path) == {"127.0.0.1": (0, 1, 100000)}
    clock[0] += 60                       # a second timeout within 120 s is not counted
    assert not t.suppressed(IP)
    t.record(IP, True)
    assert records(path) == {"127.0.0.1": (0, 1, 100000)}
    clock[0] += 100
    assert not t.suppressed(IP)
    t.record(IP, True)
    assert records(path) == {"127.0.0.1": (0, 2, 100160)}
    assert t.suppressed(IP)              # count 2, within (60 + pid & 31) * 64 s
    clock[0] = 100160 + 60 * 64 - 1
    assert t.suppressed(IP)
    clock[0] += 1
    assert not t.suppressed(IP)
    assert Table(path, now=lambda: 100160 + 60 * 64, pid=31).suppressed(IP)   # pid & 31 adds time
    t.record(IP, False)                  # a successful connection clears the count
    assert records(path) == {}
    assert open(path, "rb").read(4) == IP


def test_success_for_unlisted_address_writes_nothing(tmp_path):
    path = make_table(tmp_path)
    t = Table(path, now=lambda: 5, pid=0)
    assert not t.suppressed(IP)
    t.record(IP, False)
    assert open(path, "rb").read() == bytes(1024)


def test_full_table_replaces_the_oldest(tmp_path):
    data = bytearray(1024)
    for i in range(64):
        struct.pack_into("4sB3xI4x", data, i * 16, bytes((10, 0, 0, i)), 1, 1000 + i)
    struct.pack_into("4sB3xI4x", data, 7 * 16, bytes((10, 0, 0, 7)), 3, 10)   # 10 + 3*1024 is larger
    path = make_table(tmp_path, bytes(data))
    t = Table(path, now=lambda: 99999, pid=0)
    t.suppressed(IP)
    t.record(IP, True)
    recs = records(path)
    assert recs["127.0.0.1"] == (0, 1, 99999)           # record 0 had the smallest last + count*1024
    assert "10.0.0.0" not in recs and len(recs) == 64


def test_missing_or_empty_file_is_harmless(tmp_path):
    t = Table(str(tmp_path / "absent"), now=lambda: 5, pid=0)
    assert not t.suppressed(IP)
    t.record(IP, True)
    assert not (tmp_path / "absent").exists()


@pytest.mark.slow
def test_connect_timeouts_then_suppression(qmail_home):
    """Real connect timeouts (a listener with a full backlog), then the address is skipped."""
    qmail_home.control("timeoutconnect", "1\n")
    tcpto = os.path.join(qmail_home.queue, "lock", "tcpto")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)   # fills the accept queue
    route(qmail_home, "x.test", port)
    noconn = [b"ZSorry, I wasn't able to establish an SMTP connection. (#4.4.1)\n"]
    try:
        start = time.monotonic()
        assert qmail_remote(qmail_home, "x.test", b"a@b", b"u@x.test")[1] == noconn
        assert time.monotonic() - start >= 1
        [(index, count, when)] = records(tcpto).values()
        assert (index, count) == (0, 1) and abs(when - time.time()) < 30
        # pretend the first timeout was 3 minutes ago, so the next one counts
        with open(tcpto, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", when - 180))
        assert qmail_remote(qmail_home, "x.test", b"a@b", b"u@x.test")[1] == noconn
        assert records(tcpto)["127.0.0.1"][1] == 2
    finally:
        filler.close()
        listener.close()
    # a working peer on the same port is now skipped without a connection attempt
    with ScriptedPeer([("send", b"220 p\r\n")], port=port) as peer:
        start = time.monotonic()
        assert qmail_remote(qmail_home, "x.test", b"a@b", b"u@x.test")[1] == noconn
        assert peer.connections == 0
        # once the table is cleared (qmail-rspawn does that at start) it is tried again
        with open(tcpto, "wb") as f:
            f.write(bytes(1024))
        qmail_remote(qmail_home, "x.test", b"a@b", b"u@x.test")
        assert peer.done.wait(30) and peer.connections == 1
