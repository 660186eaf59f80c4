"""qmail-inject's header-name rule, written without re, against its regular expression."""
import re

from hypothesis import given, strategies as st

from qmailpy.inject.headers import field_name

NAME = re.compile(rb"([\x21-\x39\x3b-\x7e]+)[ \t]*:")
ALPHABET = st.sampled_from(b"aZ-:. \t\x00\x7f\x80\xff\r\n~!9;")


def by_regex(line):
    m = NAME.match(line)
    return m.group(1) if m else None


@given(st.lists(ALPHABET, max_size=12).map(bytes))
def test_field_name_is_the_regular_expression(line):
    assert field_name(line) == by_regex(line)


def test_examples():
    assert field_name(b"Subject: hi\n") == b"Subject"
    assert field_name(b"X-A \t: b\n") == b"X-A"
    assert field_name(b"MBOX-Line: From x\n") == b"MBOX-Line"
    for line in (b": x\n", b"no colon\n", b"two words: x\n", b" lead: x\n", b"caf\xc3\xa9: x\n"):
        assert field_name(line) is None, line
