"""Whether a message needs SMTPUTF8 to be relayed (docs/delivery.md "SMTPUTF8").

RFC 6531 §3.2: to a server that does not offer SMTPUTF8 a client sends neither a
non-ASCII address nor a message with UTF-8 in its header (RFC 6532). qmail's queue
keeps no "received with SMTPUTF8" flag, but the Received line qmail-smtpd writes
names it (`with UTF8SMTP`): the topmost Received field that names a protocol
(qmail-queue's own `Received: (qmail N invoked ...)` above it names none). As
Postfix does, the header counts only for such a message: 8-bit header bytes in
mail that came without SMTPUTF8 (legacy mail, never valid) go out as qmail sends
them, not bounced. No `re`: qmail-remote run as a program does not import it.
"""
import errno
import os

# The header is looked at up to here: a Received line and a From or Subject come first.
HEADER_SCAN = 65536
_CHUNK = 8192
_UTF8_PROTOCOLS = frozenset((b"UTF8SMTP", b"UTF8SMTPS", b"UTF8SMTPA", b"UTF8SMTPSA"))    # RFC 6531


class Message:
    """What the dialogue needs to know of the message: flagged (it came in with
    SMTPUTF8), header_8bit (its header has a byte above 127) and prefix, the bytes
    already read from a descriptor that cannot seek back (b'' otherwise)."""

    def __init__(self, flagged=False, header_8bit=False, prefix=b""):
        self.flagged, self.header_8bit, self.prefix = flagged, header_8bit, prefix

    @property
    def needs_smtputf8(self):
        return self.flagged and self.header_8bit


def header_end(data):
    """The length of the header in data (up to its empty line), or None if not all there."""
    if data[:1] == b"\n":
        return 0
    end = data.find(b"\n\n")
    return None if end < 0 else end + 1


def received_fields(header):
    """The Received fields of header, unfolded, top first."""
    lines = header.split(b"\n")
    for i, line in enumerate(lines):
        if line[:9].lower() == b"received:":
            field = [line]
            for more in lines[i + 1:]:
                if more[:1] not in (b" ", b"\t"):
                    break
                field.append(more)
            yield b" ".join(field)


def protocol(field):
    """The word after "with" in a Received field (uppercase), past the TLS patch's comment
    in "with (TLSv1.3:CIPHER encrypted) UTF8SMTP"; None when the field names none."""
    words = field.replace(b"\t", b" ").split()
    for i, word in enumerate(words[:-1]):
        if word.lower() != b"with":
            continue
        rest = words[i + 1:]
        if rest[0].startswith(b"("):
            close = next((j for j, w in enumerate(rest) if w.endswith(b")")), None)
            if close is None or close + 1 == len(rest):
                return None
            rest = rest[close + 1:]
        return rest[0].rstrip(b";").upper()
    return None


def classify(header):
    """Message(flagged, header_8bit) for a header's bytes."""
    flagged = False
    for field in received_fields(header):
        word = protocol(field)
        if word is not None:
            flagged = word in _UTF8_PROTOCOLS
            break
    return Message(flagged, max(header, default=0) >= 0x80)


def read_header(fd):
    """(the message's first bytes on fd up to its header's end or HEADER_SCAN, seekable):
    with pread when fd can seek (it is left at the message's start), else read from it.
    Raises OSError."""
    try:
        start = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError as e:
        if e.errno != errno.ESPIPE:
            raise
        start = None
    data = b""
    while len(data) < HEADER_SCAN and header_end(data) is None:
        if start is None:
            chunk = os.read(fd, _CHUNK)
        else:
            chunk = os.pread(fd, _CHUNK, start + len(data))
        if not chunk:
            break
        data += chunk
    return data, start is not None


def header_of(data):
    """The header in read_header()'s bytes (all of them up to HEADER_SCAN when it has no end)."""
    end = header_end(data)
    return data[:HEADER_SCAN] if end is None else data[:end]


def read_message(fd):
    """Message for the message on fd, which is left at its start: read with pread when fd
    can seek, else read and kept in .prefix for the body. Raises OSError."""
    data, seekable = read_header(fd)
    message = classify(header_of(data))
    if not seekable:
        message.prefix = data
    return message
