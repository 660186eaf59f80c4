"""Bad input and abuse against the real qmail-smtpd: every case gets a well-formed reply or a
clean close, never a traceback, and never a queued partial message."""
import re
import socket

import psutil

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from queue_view import queued
from smtpd_support import REPLY_LINE, SmtpdProcess, assert_nothing_queued, mess_count, open_data, start

SMTPLF = b"451 See https://cr.yp.to/docs/smtplf.html.\r\n"


def test_bare_lf_in_data_is_refused_and_nothing_is_queued(qmail_home):
    with start(qmail_home) as s:
        open_data(s)
        s.send(b"Subject: x\r\n\r\nfine line\r\nbare line\nmore\r\n.\r\n")
        assert s.rest() == SMTPLF
        assert s.close() == 1
        assert s.stderr == b""
    assert_nothing_queued(qmail_home)


def test_lone_cr_is_kept_as_qmail_keeps_it(qmail_home):
    with start(qmail_home) as s:
        open_data(s)
        assert s.command(b"a\rb\r\nc\r\r\n.\rd\r\n.\r\n").startswith(b"250 ok ")
    assert queued(qmail_home)[0].body_after_received() == b"a\rb\nc\r\n.\rd\n"


def test_smuggling_lf_dot_lf_never_ends_the_message(qmail_home):
    with start(qmail_home) as s:
        open_data(s)
        s.send(b"Subject: x\r\n\r\nhello\n.\nMAIL FROM:<evil@x>\r\nRCPT TO:<v@test.example>\r\n"
               b"DATA\r\nsmuggled\r\n.\r\n")
        assert s.rest() == SMTPLF
    assert_nothing_queued(qmail_home)


def test_smuggling_lf_dot_crlf_never_ends_the_message(qmail_home):
    with start(qmail_home) as s:
        open_data(s)
        s.send(b"hello\n.\r\nMAIL FROM:<evil@x>\r\n")
        assert s.rest() == SMTPLF
    assert_nothing_queued(qmail_home)


def test_smuggling_cr_dot_cr_stays_inside_one_message(qmail_home):
    with start(qmail_home) as s:
        open_data(s)
        reply = s.command(b"hello\r.\rMAIL FROM:<evil@x>\r\nRCPT TO:<v@test.example>\r\n"
                          b"DATA\r\nsmuggled\r\n.\r\n")
        assert re.match(rb"250 ok \d+ qp \d+\r\n\Z", reply)
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
    [msg] = queued(qmail_home)
    assert msg.recipients == [b"x@test.example"]
    assert msg.body_after_received() == (
        b"hello\r.\rMAIL FROM:<evil@x>\nRCPT TO:<v@test.example>\nDATA\nsmuggled\n")


def test_overlong_command_lines_are_refused_and_memory_stays_bounded(qmail_home):
    with start(qmail_home) as s:
        assert s.command(b"NOOP " + b"x" * 5000 + b"\r\n") == b"500 command line too long (#5.5.2)\r\n"
        proc = psutil.Process(s.proc.pid)
        base = proc.memory_info().rss
        chunk = b"y" * (1 << 20)
        s.send(b"MAIL FROM:<")
        for _ in range(32):
            s.send(chunk)
        peak = proc.memory_info().rss
        assert s.command(b">\r\n") == b"500 command line too long (#5.5.2)\r\n"
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"
        assert peak - base < 8 << 20


def test_nul_bytes_end_a_command_as_in_qmail_and_pass_through_data(qmail_home):
    with start(qmail_home) as s:
        assert s.command(b"NO\0OP\r\n") == b"502 unimplemented (#5.5.1)\r\n"
        assert s.command(b"NOOP\0 junk\r\n") == b"250 ok\r\n"
        assert s.command(b"MAIL FROM:<a@b.example>\0<evil@x>\r\n") == b"250 ok\r\n"
        s.command(b"RCPT TO:<x@test.example>\r\n")
        s.command(b"DATA\r\n")
        assert s.command(b"nul\0here\r\n.\r\n").startswith(b"250 ok ")
    [msg] = queued(qmail_home)
    assert msg.sender == b"a@b.example"
    assert msg.body_after_received() == b"nul\0here\n"


@pytest.mark.slow
def test_eight_bit_addresses_are_queued_byte_for_byte(qmail_home):
    with start(qmail_home) as s:
        assert s.command(b"MAIL FROM:<j\xc3\xb6e@b\xff.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<\xfc\x80@test.example>\r\n") == b"250 ok\r\n"
        s.command(b"DATA\r\n")
        assert s.command(b"\xe9t\xe9\r\n.\r\n").startswith(b"250 ok ")
    [msg] = queued(qmail_home)
    assert msg.sender == b"j\xc3\xb6e@b\xff.example"
    assert msg.recipients == [b"\xfc\x80@test.example"]
    assert msg.body_after_received() == b"\xe9t\xe9\n"


@pytest.mark.slow
def test_data_over_databytes_gets_552_with_bounded_memory(qmail_home):
    qmail_home.control("databytes", "1000000")
    with start(qmail_home) as s:
        open_data(s)
        proc = psutil.Process(s.proc.pid)
        line = b"z" * 998 + b"\r\n"
        chunk = line * 1024                         # 1 MiB
        s.send(chunk)
        base = proc.memory_info().rss
        peak = base
        for _ in range(40):
            s.send(chunk)
            peak = max(peak, proc.memory_info().rss)
        assert s.command(b".\r\n") == (
            b"552 sorry, that message size exceeds my databytes limit (#5.3.4)\r\n")
        assert peak - base < 8 << 20, (base, peak)
        # the session goes on and a message under the limit still passes
        open_data(s)
        assert s.command(b"small\r\n.\r\n").startswith(b"250 ok ")
    [msg] = queued(qmail_home)
    assert msg.body_after_received() == b"small\n"
    assert mess_count(qmail_home) == 1


def test_databytes_environment_beats_the_control_file(qmail_home):
    qmail_home.control("databytes", "1000000")
    with start(qmail_home, DATABYTES="5") as s:
        open_data(s)
        assert s.command(b"123456\r\n.\r\n").startswith(b"552 ")
    with start(qmail_home, DATABYTES="7") as s:
        open_data(s)
        assert s.command(b"123456\r\n.\r\n").startswith(b"250 ok")


@pytest.mark.slow
def test_silent_client_gets_the_timeout_reply(qmail_home):
    qmail_home.control("timeoutsmtpd", "1")
    with start(qmail_home) as s:
        assert s.rest() == b"451 timeout (#4.4.2)\r\n"
        assert s.close() == 1
    qmail_home.control("timeoutsmtpd", "1")
    with start(qmail_home) as s:
        open_data(s)
        s.send(b"half a message\r\n")
        assert s.rest() == b"451 timeout (#4.4.2)\r\n"
    assert_nothing_queued(qmail_home)


def test_disconnect_mid_data_queues_nothing(qmail_home):
    with start(qmail_home) as s:
        open_data(s)
        s.send(b"Subject: cut\r\n\r\n" + b"line\r\n" * 10000)
        s.client.shutdown(socket.SHUT_WR)
        assert s.rest() == b""
        assert s.close() == 1
        assert s.stderr == b""
    assert_nothing_queued(qmail_home)


@pytest.mark.slow
def test_ten_thousand_pipelined_rcpts(qmail_home):
    rcpts = [b"user%d@test.example" % i for i in range(10000)]
    with start(qmail_home) as s:
        sent = s.send_while_reading(b"EHLO c\r\nMAIL FROM:<a@b.example>\r\n"
                                    + b"".join(b"RCPT TO:<" + r + b">\r\n" for r in rcpts)
                                    + b"DATA\r\n")
        assert s.reply().endswith(b"250 8BITMIME\r\n")
        assert s.reply() == b"250 ok\r\n"
        # the default control/maxrcpt, 1000 (tests/test_queue_limits.py): the rest get 452
        replies = [s.reply() for _ in rcpts]
        assert replies == [b"250 ok\r\n"] * 1000 + [b"452 sorry, too many recipients (#4.5.3)\r\n"] * 9000
        assert s.reply() == b"354 go ahead\r\n"
        sent()
        assert s.command(b"hi\r\n.\r\n").startswith(b"250 ok ")
    [msg] = queued(qmail_home)
    assert msg.recipients == rcpts[:1000]


def test_pipelined_client_sends_everything_in_one_write(qmail_home):
    with start(qmail_home) as s:
        s.send(b"EHLO c.example\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<x@test.example>\r\n"
               b"RCPT TO:<nope@relay.example>\r\nRCPT TO:<y@test.example>\r\nDATA\r\n"
               b"Subject: piped\r\n\r\nbody\r\n.\r\nMAIL FROM:<c@d.example>\r\n"
               b"RCPT TO:<z@test.example>\r\nDATA\r\nsecond\r\n.\r\nQUIT\r\n")
        replies = s.rest()
    lines = replies.split(b"\r\n")[:-1]
    assert lines[:5] == [b"250-test.example", b"250-PIPELINING", b"250-SIZE 26214400",     # init's databytes
                         b"250-SMTPUTF8", b"250 8BITMIME"]
    assert lines[5:10] == [b"250 ok", b"250 ok",
                           b"553 sorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)",
                           b"250 ok", b"354 go ahead"]
    assert re.match(rb"250 ok \d+ qp \d+\Z", lines[10])
    assert lines[11:14] == [b"250 ok", b"250 ok", b"354 go ahead"]
    assert re.match(rb"250 ok \d+ qp \d+\Z", lines[14])
    assert lines[15:] == [b"221 test.example"]
    first, second = sorted(queued(qmail_home), key=lambda m: m.sender)
    assert first.recipients == [b"x@test.example", b"y@test.example"]
    assert first.body_after_received() == b"Subject: piped\n\nbody\n"
    assert (second.sender, second.body_after_received()) == (b"c@d.example", b"second\n")


PIECES = st.sampled_from([
    b"HELO x\r\n", b"EHLO y\r\n", b"MAIL FROM:<a@b.example>\r\n", b"MAIL FROM:<>\r\n",
    b"RCPT TO:<u@test.example>\r\n", b"RCPT TO:<u@other.example>\r\n", b"DATA\r\n",
    b".\r\n", b"\r\n.\r\n", b"RSET\r\n", b"NOOP\r\n", b"VRFY x\r\n", b"HELP\r\n",
    b"text\r\n", b"\n", b"\r", b".", b"\n.\n", b"\r.\r", b"\n.\r\n", b"\0", b"\xff\xfe",
    b"MAIL", b" FROM:", b"<", b">", b"\"", b"\\", b"x" * 300, b"BDAT 10\r\n", b"Received: x\r\n",
])


@pytest.mark.slow
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PIECES, max_size=25).map(b"".join) | st.binary(max_size=300))
def test_fuzzed_sessions_get_well_formed_replies_and_no_partial_messages(qmail_home, data):
    before = len(queued(qmail_home))
    with SmtpdProcess(qmail_home) as s:
        s.send(data)
        s.client.shutdown(socket.SHUT_WR)
        out = s.rest()
        code = s.close()
    assert s.stderr == b""
    assert code in (0, 1)
    lines = out.split(b"\r\n")
    assert lines[-1] == b""
    for line in lines[:-1]:
        assert REPLY_LINE.match(line + b"\r\n"), line
    accepted = [l for l in lines if re.match(rb"250 ok \d+ qp \d+\Z", l)]
    after = queued(qmail_home)
    assert len(after) - before == len(accepted)
    assert mess_count(qmail_home) == len(after)
