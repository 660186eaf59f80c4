"""The spawn protocol (docs/protocols.md "qmail-send ↔ spawners") through a real spawner process and real pipes."""
import os
import subprocess
import sys
import textwrap

import pytest

from hypothesis import given, settings, strategies as st

from qmailpy import spawn

SPAWNER = textwrap.dedent("""
    import os, sys
    from qmailpy import spawn
    os.chdir(sys.argv[1])
    def run(sender, rcpt):
        data = os.read(0, 100)
        os.write(1, b"got " + data.strip() + b" from " + sender + b" for " + rcpt)
        if rcpt.startswith(b"kill"):
            os.kill(os.getpid(), 9)
        return 0 if rcpt.startswith(b"ok") else 100
    def report(wstat, out):
        if os.WIFSIGNALED(wstat):
            return b"Zkilled:" + out
        return (b"K" if os.waitstatus_to_exitcode(wstat) == 0 else b"D") + out
    sys.exit(spawn.serve(run, report, slots=5, expected_owner=os.getuid()))
""")


def run_spawner(tmp_path, commands):
    mess = tmp_path / "mess"
    (mess / "5").mkdir(parents=True)
    (mess / "5" / "457").write_bytes(b"hello\n")
    os.mkfifo(mess / "5" / "458")
    proc = subprocess.run([sys.executable, "-c", SPAWNER, str(mess)], input=b"".join(commands),
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    replies = spawn.ReplyReader().feed(proc.stdout[1:])
    return proc.stdout[:1], {slot: (letter, text) for slot, letter, text in replies}


def test_greeting_replies_and_errors(tmp_path):
    greeting, replies = run_spawner(tmp_path, [
        spawn.encode_command(0, b"5/457", b"s@x", b"ok@y"),
        spawn.encode_command(1, b"5/457", b"s@x", b"bad@y"),
        spawn.encode_command(2, b"5/999", b"s@x", b"ok@y"),
        spawn.encode_command(3, b"5/457", b"s@x", b"nohost"),
        spawn.encode_command(4, b"5/45x", b"s@x", b"ok@y"),
    ])
    assert greeting == bytes([5])
    assert replies[0] == (b"K", b"got hello from s@x for ok@y")
    assert replies[1] == (b"D", b"got hello from s@x for bad@y")
    assert replies[2] == (b"Z", b"qmail-spawn unable to open message. (#4.3.0)\n")
    assert replies[3] == (b"D", b"Sorry, address must include host name. (#5.1.3)\n")
    assert replies[4] == (b"D", b"Internal error: messid has nonnumerics. (#5.3.5)\n")


def test_slot_checks_and_wrong_type(tmp_path):
    _, replies = run_spawner(tmp_path, [
        spawn.encode_command(7, b"5/457", b"s@x", b"ok@y"),
        spawn.encode_command(1, b"5/458", b"s@x", b"ok@y"),
    ])
    assert replies[7] == (b"Z", b"Internal error: delnum too big. (#4.3.5)\n")
    assert replies[1] == (b"Z", b"Sorry, message has wrong type. (#4.3.5)\n")


def test_child_killed_by_signal_still_reports(tmp_path):
    _, replies = run_spawner(tmp_path, [spawn.encode_command(2, b"5/457", b"s@x", b"kill@y")])
    assert replies[2] == (b"Z", b"killed:got hello from s@x for kill@y")


def test_reply_reader_slot_zero_and_split_reads():
    reader = spawn.ReplyReader()
    assert reader.feed(b"\0") == []               # slot 0 byte, not a terminator
    assert reader.feed(b"Kdid_1") == []
    assert reader.feed(b"+0+0/\0\x01Zx\0") == [(0, b"K", b"did_1+0+0/"), (1, b"Z", b"x")]


def test_verp():
    assert spawn.verp(b"owner-@lists.x-@[]", b"joe@y.org") == b"owner-joe=y.org@lists.x"
    assert spawn.verp(b"plain@x", b"joe@y.org") == b"plain@x"
    assert spawn.verp(b"nobody-@[]", b"joe@y.org") == b"nobody-@[]"


def test_truncate_report():
    assert spawn.truncate_report(b"x" * 3000) == b"x" * 3000
    cut = spawn.truncate_report(b"x" * 3001)
    assert cut == b"x" * 2966 + b"\nError report too long, sorry.\n" and len(cut) == 2997


def _fed_in_pieces(reader, stream, cuts):
    out = []
    start = 0
    for cut in sorted(set(cuts)) + [len(stream)]:
        out += reader.feed(stream[start:cut])
        start = cut
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=8),
       st.lists(st.integers(0, 400), max_size=12))
def test_reply_reader_reads_the_same_however_the_stream_is_cut(replies, cuts):
    stream = b"".join(bytes((slot,)) + text.replace(b"\0", b"") + b"\0" for slot, text in replies)
    whole = [(slot, t[:1], t[1:]) for slot, t in ((s, x.replace(b"\0", b"")) for s, x in replies)]
    assert _fed_in_pieces(spawn.ReplyReader(), stream, cuts) == whole
    assert _fed_in_pieces(spawn.ReplyReader(), stream, range(len(stream))) == whole


def test_reply_reader_keeps_at_most_report_max_bytes_of_a_reply():
    reader = spawn.ReplyReader()
    long_reply = b"\x07K" + b"y" * (spawn.REPORT_MAX * 2) + b"\0\x08Zshort\0"
    replies = _fed_in_pieces(reader, long_reply, range(0, len(long_reply), 4093))
    assert replies[0][:2] == (7, b"K") and len(replies[0][2]) == spawn.REPORT_MAX - 2
    assert replies[1] == (8, b"Z", b"short")


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=20), st.binary(max_size=20),
                          st.binary(max_size=20)), max_size=6),
       st.lists(st.integers(0, 300), max_size=12))
def test_command_reader_reads_the_same_however_the_stream_is_cut(commands, cuts):
    clean = [(slot, m.replace(b"\0", b""), s.replace(b"\0", b""), r.replace(b"\0", b""))
             for slot, m, s, r in commands]
    stream = b"".join(bytes((slot,)) + m + b"\0" + s + b"\0" + r + b"\0" for slot, m, s, r in clean)
    for pieces in (cuts, range(len(stream))):
        got = _fed_in_pieces(spawn.CommandReader(), stream, pieces)
        assert [(c.slot, c.messid, c.sender, c.recipient) for c in got] == clean
