"""The DATA state machine against a byte-by-byte transcription of qmail-smtpd's blast().

qmailpy processes whole regions of lines at once; these properties check that,
for any input and any way the input is cut into reads, it stores exactly what
qmail's per-byte loop stores, ends at the same byte, and fails on the same
stray LF.
"""
import pytest

from hypothesis import given, settings, strategies as st

from qmailpy.smtpd.data import DataReader, StrayNewline


def reference(data):
    """qmail's blast(): (stored bytes, hops, consumed) or 'straynewline' or None (needs more)."""
    out = bytearray()
    state = 1
    hops = 0
    inheader, pos, mx, my, mz = True, 0, True, True, True
    for i, ch in enumerate(data):
        c = bytes([ch])
        if inheader:
            if pos < 9:
                if c not in (b"delivered"[pos:pos + 1], b"DELIVERED"[pos:pos + 1]):
                    mz = False
                if mz and pos == 8:
                    hops += 1
                if pos < 8:
                    if c not in (b"received"[pos:pos + 1], b"RECEIVED"[pos:pos + 1]):
                        mx = False
                    if mx and pos == 7:
                        hops += 1
                if pos < 2:
                    if c != b"\r\n"[pos:pos + 1]:
                        my = False
                    if my and pos == 1:
                        inheader = False
                pos += 1
            if c == b"\n":
                pos, mx, my, mz = 0, True, True, True
        if state == 0:
            if c == b"\n":
                return "straynewline"
            if c == b"\r":
                state = 4
                continue
        elif state == 1:
            if c == b"\n":
                return "straynewline"
            if c == b".":
                state = 2
                continue
            if c == b"\r":
                state = 4
                continue
            state = 0
        elif state == 2:
            if c == b"\n":
                return "straynewline"
            if c == b"\r":
                state = 3
                continue
            state = 0
        elif state == 3:
            if c == b"\n":
                return bytes(out), hops, i + 1
            out += b".\r"
            if c == b"\r":
                state = 4
                continue
            state = 0
        elif state == 4:
            if c == b"\n":
                state = 1
            elif c != b"\r":
                out += b"\r"
                state = 0
        out.append(ch)
    return None


def run_reader(data, cuts, databytes=0):
    stored = bytearray()
    reader = DataReader(stored.extend, databytes)
    buf = b""
    pieces = []
    last = 0
    for cut in sorted(set(c for c in cuts if 0 < c < len(data))) + [len(data)]:
        pieces.append(data[last:cut])
        last = cut
    total = 0
    try:
        for piece in pieces:
            buf += piece
            consumed = reader.feed(buf)
            total += consumed
            buf = buf[consumed:]
            if reader.done:
                return bytes(stored), reader.hops, total
    except StrayNewline:
        return "straynewline"
    return None


ALPHABET = st.sampled_from([b"\r", b"\n", b".", b"a", b"R", b"received:", b"Delivered", b"\r\n",
                            b"\r\n.\r\n", b"\n.\n", b"\r.\r", b"\n.\r\n", b"\x00", b"\xff"])


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(st.lists(ALPHABET, max_size=40).map(b"".join), st.lists(st.integers(0, 200), max_size=8))
def test_same_result_as_qmail_for_any_input_and_any_read_sizes(data, cuts):
    assert run_reader(data, cuts) == reference(data)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"line\r\n", b".dot\r\n", b"..\r\n", b"x\ry\r\n", b"\r\n",
                                 b"Received: x\r\n"]), max_size=30).map(b"".join),
       st.lists(st.integers(0, 400), max_size=5))
def test_well_formed_messages_end_where_qmail_ends_them(body, cuts):
    data = body + b".\r\n" + b"MAIL FROM:<next>\n"
    assert run_reader(data, cuts) == reference(data)


def test_smuggling_sequences_do_not_end_data():
    for trick in (b"\n.\n", b"\r.\r", b"\r\n.\r", b"\r.\r\n"):
        data = b"Subject: x\r\n\r\nbefore" + trick + b"MAIL FROM:<evil>\r\n"
        result = run_reader(data, [])
        assert result in (None, "straynewline"), trick
    assert run_reader(b"a\n.\r\nMAIL FROM:<evil>\r\n", []) == "straynewline"


def test_long_lines_are_passed_on_in_bounded_pieces():
    line = b"x" * 200000 + b"\r\n"
    stored = bytearray()
    reader = DataReader(stored.extend)
    buf = b""
    peak = 0
    for i in range(0, len(line), 4096):
        buf += line[i:i + 4096]
        buf = buf[reader.feed(buf):]
        peak = max(peak, len(buf))
    buf += b".\r\n"
    reader.feed(buf)
    assert reader.done
    assert bytes(stored) == b"x" * 200000 + b"\n"
    assert peak < 16384 + 4096 + 1


def test_databytes_counts_stored_bytes_and_stops_storing():
    stored = bytearray()
    reader = DataReader(stored.extend, databytes=10)
    reader.feed(b"0123456789\r\n.\r\n")          # 11 stored bytes with the LF
    assert reader.done and reader.overflow
    assert len(stored) == 0
    stored.clear()
    reader = DataReader(stored.extend, databytes=11)
    reader.feed(b"0123456789\r\n.\r\n")
    assert reader.done and not reader.overflow and bytes(stored) == b"0123456789\n"
