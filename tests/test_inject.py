"""qmail-inject: header completion, rewriting, recipients, environment, exit codes (docs/submission.md "qmail-inject")."""
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from queue_view import queued
from smtpd_support import env, mess_count

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def inject(home, message, *args, **extra):
    return home.run(["qmail-inject", *args], input=message, env=env(home, **extra))


def printed(home, message, *args, **extra):
    done = inject(home, message, "-n", *args, **extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def header_of(text):
    return text.split(b"\n\n", 1)[0].split(b"\n")


def test_missing_fields_are_added_before_the_original_ones(qmail_home):
    out = printed(qmail_home, b"Subject: hi\nTo: bob\n\nbody\n", NAME="Joe Q. Public")
    lines = header_of(out)
    assert lines[0] == b"Return-Path: <joe@test.example>"
    assert re.match(rb"Date: \d{1,2} \w{3} \d{4} \d\d:\d\d:\d\d -0000\Z", lines[1])
    assert re.match(rb"Message-ID: <\d{14}\.\d+\.qmail@test\.example>\Z", lines[2])
    assert lines[3] == b'From: "Joe Q. Public" <joe@test.example>'
    assert lines[4:] == [b"Subject: hi", b"To: bob@test.example"]
    assert out.endswith(b"\n\nbody\n")


def test_present_fields_are_kept_and_cc_not_shown_added_without_to(qmail_home):
    msg = (b"From: Ann <ann@a.example>\nDate: Mon, 1 Jan 2024 00:00:00 +0000\n"
           b"Message-ID: <x@y>\nBcc: hidden@h.example\n\nb\n")
    lines = header_of(printed(qmail_home, msg, "-a", "r@test.example"))
    assert lines == [b"Return-Path: <joe@test.example>", b"Cc: recipient list not shown: ;",
                     b"From: Ann <ann@a.example>", b"Date: Mon, 1 Jan 2024 00:00:00 +0000",
                     b"Message-ID: <x@y>"]


def test_addresses_are_rewritten(qmail_home):
    qmail_home.control("defaultdomain", "dom.example")
    qmail_home.control("plusdomain", "plus.example")
    msg = (b"To: plain, <host@box>, a@b.example., c@d+, \"q u\"@x.example, <>,\n"
           b"  <@route.example:r@test.example>, w@[]\nCc: Named Person <np@lit>\n\nx\n")
    lines = header_of(printed(qmail_home, msg))
    to = [l for l in lines if l.startswith(b"To:")][0]
    assert to == (b"To: plain@test.example, <host@box.dom.example>, a@b.example, "
                  b"c@d.plus.example,")
    cont = lines[lines.index(to) + 1]
    assert cont == b' "q u"@x.example, <>, <r@test.example>, w@[]'
    assert b"Cc: Named Person <np@lit.dom.example>" in lines


def test_long_address_lists_are_folded_at_80_columns(qmail_home):
    rcpts = b", ".join(b"user%02d@long-domain-name.example" % i for i in range(8))
    lines = header_of(printed(qmail_home, b"To: " + rcpts + b"\n\nx\n"))
    to = [l for l in lines if l.startswith(b"To:") or l.startswith(b" ")]
    assert len(to) > 1 and all(len(l) <= 80 for l in to)
    assert all(l.endswith(b",") for l in to[:-1])
    assert b"".join(to).replace(b", ", b",") == (b"To:" + rcpts.replace(b", ", b",")).replace(b"To:", b"To: ")


def test_queued_envelope_from_arguments_or_header(qmail_home):
    msg = b"To: a@x.example\nCc: b@y.example\nBcc: c@z.example\nSubject: s\n\nbody\n"
    assert inject(qmail_home, msg).returncode == 0                      # -A, no args: header
    assert inject(qmail_home, msg, "arg@w.example").returncode == 0      # -A with args: args
    assert inject(qmail_home, msg, "-H", "arg@w.example").returncode == 0  # both, args first
    assert inject(qmail_home, msg, "-h", "ignored@w.example").returncode == 0
    got = sorted((m.recipients for m in queued(qmail_home)), key=len)
    assert sorted(got) == sorted([
        [b"a@x.example", b"b@y.example", b"c@z.example"],
        [b"arg@w.example"],
        [b"arg@w.example", b"a@x.example", b"b@y.example", b"c@z.example"],
        [b"a@x.example", b"b@y.example", b"c@z.example"],
    ])
    for m in queued(qmail_home):
        body = m.body_after_received(1)
        assert b"Bcc" not in body and b"c@z.example" not in body
        assert body.endswith(b"Subject: s\n\nbody\n")
        assert m.sender == b"joe@test.example"


def test_resent_messages_use_resent_recipients_and_resent_fields(qmail_home):
    msg = (b"From: orig@o.example\nTo: orig-rcpt@o.example\nDate: x\nMessage-ID: <m@o>\n"
           b"Resent-To: new@n.example\nResent-Bcc: secret@n.example\n\nbody\n")
    assert inject(qmail_home, msg).returncode == 0
    [m] = queued(qmail_home)
    assert m.recipients == [b"new@n.example", b"secret@n.example"]
    lines = header_of(m.body_after_received(1))
    assert re.match(rb"Resent-Date: ", lines[0])
    assert re.match(rb"Resent-Message-ID: <", lines[1])
    assert lines[2] == b"Resent-From: joe@test.example"
    assert b"From: orig@o.example" in lines and b"Resent-Bcc: secret@n.example" not in lines


def test_sender_priority_f_over_return_path_over_default(qmail_home):
    msg = b"Return-Path: <rp@r.example>\nTo: x@test.example\n\nb\n"
    assert inject(qmail_home, msg, "-f", "forced").returncode == 0
    assert inject(qmail_home, msg).returncode == 0
    assert inject(qmail_home, msg, QMAILINJECT="s").returncode == 0
    assert inject(qmail_home, msg, "-f", "").returncode == 0
    senders = sorted(m.sender for m in queued(qmail_home))
    assert senders == sorted([b"forced@test.example", b"rp@r.example", b"joe@test.example", b""])
    for m in queued(qmail_home):
        assert b"Return-Path" not in m.mess


def test_environment_variables(qmail_home):
    out = printed(qmail_home, b"To: x\n\nb\n", QMAILUSER="qu", MAILUSER="mu", QMAILHOST="qh.example",
                  MAILNAME="Mail Name", QMAILIDHOST="id.example", QMAILDEFAULTHOST="dh.example",
                  QMAILDEFAULTDOMAIN="dd.example")
    lines = header_of(out)
    assert lines[0] == b"Return-Path: <qu@qh.example>"
    assert lines[2].endswith(b".qmail@id.example>")
    assert lines[3] == b'From: "Mail Name" <qu@qh.example>'
    assert lines[4] == b"To: x@dh.example"
    lines = header_of(printed(qmail_home, b"\nb\n", MAILUSER="mu", MAILHOST="mh.example",
                              NAME="N", QMAILINJECT="c", QMAILSUSER="su", QMAILSHOST="sh.example"))
    assert lines[0] == b"Return-Path: <su@sh.example>"
    assert lines[3] == b"From: mu@mh.example (N)"


def test_qmailinject_f_i_r_m_flags(qmail_home):
    lines = header_of(printed(qmail_home, b"From: x@y.example\nMessage-ID: <old@id>\n\nb\n",
                              QMAILINJECT="fi"))
    assert b"From: joe@test.example" in lines and b"From: x@y.example" not in lines
    assert not any(l == b"Message-ID: <old@id>" for l in lines)
    ret = header_of(printed(qmail_home, b"\nb\n", QMAILINJECT="r"))[0]
    assert ret == b"Return-Path: <joe-@test.example-@[]>"
    ret = header_of(printed(qmail_home, b"\nb\n", QMAILINJECT="m"))[0]
    assert re.match(rb"Return-Path: <joe-\d+\.\d+@test\.example>\Z", ret)


def test_mail_followup_to_for_known_lists(qmail_home):
    import os
    lists = os.path.join(qmail_home.path, "mftlists")
    with open(lists, "w") as f:
        f.write("list@lists.example\n")
    lines = header_of(printed(qmail_home, b"To: List@Lists.example\nCc: friend@f.example\n\nb\n",
                              QMAILMFTFILE=lists))
    assert b"Mail-Followup-To: List@Lists.example, friend@f.example" in lines
    lines = header_of(printed(qmail_home, b"To: other@o.example\n\nb\n", QMAILMFTFILE=lists))
    assert not any(l.startswith(b"Mail-Followup-To") for l in lines)


def test_header_ends_at_a_line_that_is_not_a_field(qmail_home):
    out = printed(qmail_home, b"Subject: s\n  continued\nthis is body text\nmore\n")
    assert out.endswith(b"Subject: s\n  continued\n\nthis is body text\nmore\n")
    out = printed(qmail_home, b"From someone Mon Jan 1\nSubject: s\n\nb\n")
    assert b"\nMBOX-Line: From someone Mon Jan 1\n" in out
    out = printed(qmail_home, b"Content-Length: 3\nSubject: s\n\nb\n")
    assert b"Content-Length" not in out


def test_message_is_queued_byte_for_byte_after_the_header(qmail_home):
    body = bytes(range(256)) * 4 + b"\r\nno final newline"
    assert inject(qmail_home, b"Subject: bin\n\n" + body, "r@test.example").returncode == 0
    [m] = queued(qmail_home)
    assert m.body_after_received(1).endswith(b"Subject: bin\n\n" + body)


@pytest.mark.parametrize("message, needle", [
    (b"From: <unbalanced@x\n\nb\n", b"invalid header field"),
    (b"Reply-To: \"open quote@x\n\nb\n", b"invalid header field"),
    (b"Sender: a@b>\n\nb\n", b"invalid header field"),
    (b"To: (unclosed comment\n\nb\n", b"invalid header field"),
    (b"Subject: nobody to send to\n\nb\n", b"no recipients"),
])
def test_malformed_headers_exit_100_with_a_clear_message(qmail_home, message, needle):
    done = inject(qmail_home, message)
    assert done.returncode == 100
    assert done.stderr.startswith(b"qmail-inject: fatal: ")
    assert needle in done.stderr
    assert b"Traceback" not in done.stderr
    assert mess_count(qmail_home) == 0


def test_unparsable_recipient_field_is_kept_when_arguments_give_recipients(qmail_home):
    out = printed(qmail_home, b"To: <broken\n\nb\n", "-a", "r@test.example")
    assert b"\nTo: <broken\n" in out


@pytest.mark.parametrize("args", [["-x"], ["-f"], ["<unbalanced"], ["-f", "a@b, c@d", "r"]])
def test_bad_arguments_exit_100(qmail_home, args):
    done = inject(qmail_home, b"\nb\n", *args)
    assert done.returncode == 100
    assert done.stderr.startswith(b"qmail-inject: ")
    assert b"Traceback" not in done.stderr
    assert mess_count(qmail_home) == 0


def test_queue_failures_map_to_100_and_111(qmail_home):
    import os
    script = os.path.join(qmail_home.path, "qq")
    for code, expected, text in ((31, 100, b"permanently rejected"), (71, 111, b"temporarily")):
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat >/dev/null\nexit %d\n" % code)
        os.chmod(script, 0o755)
        done = inject(qmail_home, b"\nb\n", "r@test.example", QMAILQUEUE=script)
        assert done.returncode == expected
        assert done.stderr.startswith(b"qmail-inject: fatal: mail server ") and text in done.stderr


HEADER_PIECES = st.sampled_from([
    b"To: ", b"Cc: ", b"From: ", b"Reply-To: ", b"Bcc: ", b"Resent-To: ", b"Subject: ",
    b"Return-Path: ", b"X-Other: ", b"a@b.example", b"plain", b"<", b">", b"\"", b"(", b")", b"[",
    b"]", b",", b";", b":", b"@", b".", b" ", b"\t", b"\n", b"\n ", b"\r\n", b"\0", b"\xff",
    b"From ", b"Name <n@x>", b"group: a, b;",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(HEADER_PIECES, max_size=30).map(b"".join),
       st.lists(st.sampled_from(["r", "a@b.example", "<x>", "<", "\"", "(c)", "@", ""]),
                max_size=3))
def test_fuzzed_headers_either_compose_or_fail_cleanly(header_bytes, args):
    import io
    from qmailpy.inject.compose import InjectError, compose
    from qmailpy.inject.headers import read_header

    class Settings:
        user, host, name, suser, shost, flags, mft = b"joe", None, None, None, None, "", None
        defaultdomain = defaulthost = plusdomain = idhost = b"test.example"

        def flag(self, letter):
            return False

    header = read_header(io.BytesIO(header_bytes + b"\n\nbody\n"))
    try:
        composed = compose(header, Settings(), "A", [a.encode() for a in args])
    except InjectError as e:
        assert e.code == 100
        return
    assert all(isinstance(r, bytes) and r for r in composed.recipients)
    assert composed.header.endswith(b"\n")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(HEADER_PIECES, max_size=20).map(b"".join))
def test_fuzzed_messages_are_queued_whole_or_refused_with_100(qmail_home, header_bytes):
    before = len(queued(qmail_home))
    done = inject(qmail_home, header_bytes + b"\n\nbody\n", "-H", "r@test.example")
    assert b"Traceback" not in done.stderr
    after = len(queued(qmail_home))
    if done.returncode == 0:
        assert done.stderr == b""
        assert after == before + 1
    else:
        assert done.returncode == 100
        assert done.stderr.startswith(b"qmail-inject: fatal: ")
        assert after == before
    assert mess_count(qmail_home) == after


@pytest.mark.both_backends
def test_an_address_with_a_nul_byte_is_refused_before_queueing(qmail_home):
    """Found by the fuzz test above: 'To: <NUL>' became the recipient '\\0@host', which
    qmail-queue read as a broken envelope (91, 'qq internal bug') and, as qmail does for 91,
    left its files to the 36-hour cleanup."""
    done = inject(qmail_home, b"To: \0\n\nbody\n", "-H", "r@test.example")
    assert done.returncode == 100
    assert done.stderr.startswith(b"qmail-inject: fatal: unable to queue address ")
    assert queued(qmail_home) == [] and mess_count(qmail_home) == 0


def test_F_option_names_the_sender_above_the_environment(qmail_home):
    lines = header_of(printed(qmail_home, b"\nb\n", "-F", "Given Name", QMAILNAME="Env Name"))
    assert lines[3] == b'From: "Given Name" <joe@test.example>'
    lines = header_of(printed(qmail_home, b"\nb\n", "-F", 'Quote " Back\\slash'))
    assert lines[3] == b'From: "Quote \\" Back\\\\slash" <joe@test.example>'
