"""The message as milters see and change it (docs/milter.md "The message").

The spooled message (qmailpy.queue.spool.Spool, LF line ends, the Received line
first) is read back in pieces: its header section into memory (at most
HEADER_MAX bytes; what follows is body, as Postfix treats an over-long header),
its body streamed to each milter as CRLF lines in SMFIC_BODY chunks of at most
65535 bytes. A replacement body (SMFIR_REPLBODY) goes into a Spool of its own,
its CRLFs back to LFs. Edits() collects what milters ask for; write() puts the
edited message out in pieces.
"""
import struct

from qmailpy.milter.protocol import BODY_CHUNK, MilterError, strings
from qmailpy.queue.spool import Spool

HEADER_MAX = 1 << 20


class Message:
    """headers: [[name, raw value after the colon (folds as LF)]]; the body starts at body_at."""

    def __init__(self, spool):
        self.spool = spool
        self.headers = []
        self.body_at = 0
        self.separator = False      # a blank line ends the header section
        self._parse()

    def _parse(self):
        buf = bytearray()
        offset = 0                  # of buf[0] in the message
        for piece in self.spool.pieces():
            buf += piece
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line = bytes(buf[:nl])
                if line == b"":
                    self.body_at, self.separator = offset + 1, True
                    return
                if line[:1] in (b" ", b"\t") and self.headers:
                    self.headers[-1][1] += b"\n" + line
                else:
                    colon = line.find(b":")
                    name = line[:colon]
                    if colon <= 0 or not name.strip() or b" " in name.strip() or \
                            offset + nl >= HEADER_MAX:
                        self.body_at = offset
                        return
                    self.headers.append([name, line[colon + 1:]])
                del buf[:nl + 1]
                offset += nl + 1
            if offset + len(buf) >= HEADER_MAX:
                self.body_at = offset
                return
        self.body_at = offset       # (a last line without its LF is body)

    def body_pieces(self, spool=None):
        """The body (LF line ends), from the spool, or from a replacement spool."""
        if spool is not None:
            yield from spool.pieces()
            return
        skip = self.body_at
        for piece in self.spool.pieces():
            if skip >= len(piece):
                skip -= len(piece)
                continue
            yield bytes(piece[skip:]) if skip else piece
            skip = 0


def crlf_chunks(pieces):
    """LF-ended pieces as CRLF text in chunks of at most BODY_CHUNK bytes."""
    for piece in pieces:
        data = bytes(piece).replace(b"\n", b"\r\n")
        for at in range(0, len(data), BODY_CHUNK):
            yield data[at:at + BODY_CHUNK]


class Edits:
    """What the milters asked for at the end of the message, applied in the order given."""

    def __init__(self, message, sender, recipients):
        self.message = message
        self.headers = [list(h) for h in message.headers]
        self.sender = sender
        self.recipients = list(recipients)
        self.body = None            # a Spool with the replacement body
        self.quarantine = False
        self._cr = False            # the replacement's last chunk ended in CR

    def header_value(self, value, leadspc):
        value = value.replace(b"\r\n", b"\n")
        return value if leadspc and value[:1] in (b" ", b"\t") else b" " + value

    def add_header(self, data, leadspc):
        name, value = strings(data, 2)
        self.headers.append([name, self.header_value(value, leadspc)])

    def insert_header(self, data, leadspc):
        index = _index(data)
        name, value = strings(data[4:], 2)
        self.headers.insert(min(index, len(self.headers)), [name, self.header_value(value, leadspc)])

    def change_header(self, data, leadspc):
        index = _index(data)
        name, value = strings(data[4:], 2)
        seen = 0
        for at, header in enumerate(self.headers):
            if header[0].lower() == name.lower():
                seen += 1
                if seen == max(index, 1):
                    if value:
                        header[1] = self.header_value(value, leadspc)
                    else:
                        del self.headers[at]
                    return
        if value:
            self.headers.append([name, self.header_value(value, leadspc)])

    def add_recipient(self, data):
        self.recipients.append(_address(strings(data)[0]))

    def delete_recipient(self, data):
        gone = _address(strings(data)[0]).lower()
        self.recipients = [r for r in self.recipients if r.lower() != gone]

    def change_sender(self, data):
        self.sender = _address(strings(data)[0])

    def replace_body(self, data):
        if self.body is None:
            self.body = Spool()
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        self.body.write(data.replace(b"\r\n", b"\n"))

    def write(self, sink):
        """The edited message into sink(bytes), in pieces."""
        if self._cr:
            self.body.write(b"\r")
            self._cr = False
        sink(b"".join(name + b":" + value + b"\n" for name, value in self.headers))
        if self.message.separator or self.body is not None:
            sink(b"\n")
        for piece in self.message.body_pieces(self.body):
            sink(bytes(piece))
        if self.body is not None and self.body.error is not None:
            raise self.body.error

    def close(self):
        if self.body is not None:
            self.body.close()


def _index(data):
    if len(data) < 4:
        raise MilterError("a header index is missing")
    return struct.unpack(">I", data[:4])[0]


def _address(addr):
    addr = addr.strip()
    if addr.startswith(b"<") and addr.endswith(b">"):
        addr = addr[1:-1]
    if b"\n" in addr or b"\r" in addr:
        raise MilterError("an address with a line break")
    return addr
