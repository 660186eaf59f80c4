"""The DATA state machine of qmail-smtpd (docs/submission.md "qmail-smtpd"), chunk by chunk.

Input is the raw byte stream after "354"; output is what goes into the queue:
every CRLF becomes LF, every other CR stays, a leading "." is removed unless
the next byte is CR, and the line "." CRLF ends the message. Any LF that does
not follow a CR is fatal (the 451 smtplf reply): so LF.LF, LF.CRLF, CRLF.LF and
CR.CR can neither end a message nor start a second one (no SMTP smuggling).

Work happens per complete line region with bulk bytes operations, so cost is
linear and memory is bounded by the read size plus LONG_LINE, however long the
stream or its lines are.
"""
import re

MAX_HOPS = 100
LONG_LINE = 16384          # a line longer than this is passed on in pieces

_DOT_STUFFED = re.compile(rb"(?m)^\.(?!\r)")
_END = b"\n.\r\n"


class StrayNewline(Exception):
    """An LF without a CR before it: qmail answers 451 and drops the connection."""


class DataReader:
    """Feed raw bytes; stored bytes go to sink(bytes) until databytes is exceeded.

    feed() returns the number of input bytes consumed; done is set when the
    terminating line was consumed (the rest of the buffer is the next command).
    """

    def __init__(self, sink, databytes=0):
        self.sink = sink
        self.databytes = databytes
        self.stored = 0
        self.overflow = False
        self.hops = 0
        self.in_header = True
        self.midline = False        # the previous piece ended inside a line
        self.done = False

    def _put(self, data):
        if not data:
            return
        self.stored += len(data)
        if self.overflow:
            return
        if self.databytes and self.stored > self.databytes:
            self.overflow = True
            return
        self.sink(data)

    def _count_hops(self, line):
        head = line[:9].lower()
        if head.startswith(b"received") or head == b"delivered":
            self.hops += 1

    def feed(self, buf):
        """Consume what can be decided from buf; return the count of bytes consumed."""
        start = 0
        if self.midline:
            nl = buf.find(b"\n")
            if nl < 0:
                return self._partial(buf, 0)
            line = buf[:nl + 1]
            if nl == 0 or buf[nl - 1] != 13:
                raise StrayNewline()
            self._put(line[:-2] + b"\n")
            self.midline = False
            start = nl + 1
        while self.in_header:
            nl = buf.find(b"\n", start)
            if nl < 0:
                return self._partial(buf, start)
            if nl == start or buf[nl - 1] != 13:
                raise StrayNewline()
            line = buf[start:nl + 1]
            if line == b".\r\n":
                self.done = True
                return nl + 1
            if line == b"\r\n":
                self.in_header = False
            else:
                self._count_hops(line)
            if line[:1] == b"." and line[1:2] != b"\r":
                line = line[1:]
            self._put(line[:-2] + b"\n")
            start = nl + 1
        # Body: the end is the first line ".\r\n"; everything before it is whole lines.
        if buf.startswith(b".\r\n", start):
            self.done = True
            return start + 3
        end = buf.find(_END, start)
        if end >= 0:
            region_end = end + 1
            self.done = True
            consumed = end + 4
        else:
            region_end = buf.rfind(b"\n", start) + 1
            if region_end == 0:
                return self._partial(buf, start)
            consumed = region_end
        region = buf[start:region_end]
        if region.count(b"\n") != region.count(b"\r\n"):
            raise StrayNewline()
        region = region.replace(b"\r\n", b"\n")
        if region.startswith(b".") or b"\n." in region:
            region = _DOT_STUFFED.sub(b"", region)
        self._put(region)
        if not self.done and consumed < len(buf) and len(buf) - consumed > LONG_LINE:
            return consumed + self._partial(buf[consumed:], 0)
        return consumed

    def _partial(self, buf, start):
        """No LF in buf[start:]: pass on a long line's head, keep short tails for later."""
        rest = len(buf) - start
        if rest <= LONG_LINE:
            return start
        piece = buf[start:]
        if not self.midline:
            if self.in_header:
                self._count_hops(piece)
            if piece[:1] == b"." and piece[1:2] != b"\r":
                piece = piece[1:]
        keep = 1 if piece.endswith(b"\r") else 0      # a CR may belong to the CRLF
        self._put(piece[:len(piece) - keep])
        self.midline = True
        return len(buf) - keep
