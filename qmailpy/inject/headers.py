"""Reading a message's header as qmail-inject does (docs/submission.md "qmail-inject").

The header is the lines up to the first empty line, or up to the first line
that is neither "name:" nor a continuation (space/tab); in that case a blank
line is inserted before it. A "From " line becomes "MBOX-Line: From ...".
"""

def field_name(line):
    """The name of a header line "NAME[ \t]*:..." (NAME: bytes 0x21-0x7e but ':'), or None.

    Written out rather than as a regular expression: importing re costs sendmail,
    which runs once per message, about 4 ms."""
    colon = line.find(b":")
    if colon <= 0:
        return None
    name = line[:colon].rstrip(b" \t")
    if not name or not name.isascii() or any(c <= 0x20 or c == 0x7f for c in name):
        return None
    return name

# Fields whose addresses are reparsed and rewritten, by kind.
RECIPIENT_FIELDS = {b"to", b"cc", b"bcc", b"apparently-to"}
RESENT_RECIPIENT_FIELDS = {b"resent-to", b"resent-cc", b"resent-bcc"}
SENDER_FIELDS = {b"sender", b"from", b"reply-to", b"return-path", b"return-receipt-to",
                 b"errors-to", b"resent-sender", b"resent-from", b"resent-reply-to"}
RESENT_MARKERS = {b"resent-sender", b"resent-from", b"resent-reply-to", b"resent-to",
                  b"resent-cc", b"resent-bcc", b"resent-date", b"resent-message-id"}
DROPPED = {b"bcc", b"resent-bcc", b"content-length", b"return-path"}


class Field:
    """One header field: its name as written, lowercased key, and the raw lines (with LFs)."""
    __slots__ = ("name", "key", "raw")

    def __init__(self, name, raw):
        self.name = name
        self.key = name.lower()
        self.raw = raw

    def body(self):
        """Everything after the colon, continuation lines included."""
        colon = self.raw.index(b":")
        return self.raw[colon + 1:]


class Header:
    def __init__(self):
        self.fields = []
        self.separator = b"\n"       # the empty line ending the header (inserted if absent)
        self.body_start = b""        # bytes already read that belong to the body

    def has(self, key):
        return any(f.key == key for f in self.fields)


def read_header(stream):
    """A Header from a binary stream positioned at the message start."""
    header = Header()
    current = None
    while True:
        line = stream.readline()
        if not line:
            break
        if line in (b"\n", b"\r\n"):
            header.separator = line
            break
        if line[:1] in (b" ", b"\t") and current is not None:
            current.raw += line if line.endswith(b"\n") else line + b"\n"
            continue
        if line.startswith(b"From "):
            line = b"MBOX-Line: " + line
        name = field_name(line)
        if name is None:
            header.body_start = line
            break
        current = Field(name, line if line.endswith(b"\n") else line + b"\n")
        header.fields.append(current)
    return header


def is_resent(header):
    return any(f.key in RESENT_MARKERS for f in header.fields)
