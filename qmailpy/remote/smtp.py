"""qmail-remote's SMTP client dialogue (docs/delivery.md "SMTP dialogue"), byte for byte.

HELO only; each command is written and its reply read before the next; the
reply code comes from the first line and continuation lines (4th byte '-')
are read to the end. Every read and every write has its own timeout
(timeoutremote); not in qmail, the whole dialogue also has a deadline
(timeoutremotesession), so a peer that drips its replies a byte at a time, each
within the timeout, is still left (class Deadline). The result is a list of
records, each a letter and a text: `r` (recipient accepted), `h`/`s`
(recipient refused permanently / temporarily), then one K, Z or D verdict that
ends the run.
"""
import os
import socket
import time

SMTP_TEXT_MAX = 5000          # HUGESMTPTEXT
READ_CHUNK = 65536


class Dropped(Exception):
    """The connection broke or timed out."""


class Deadline(Dropped):
    """The dialogue outlasted its deadline."""


class PartialLine(Exception):
    """The message's last line has no LF."""


class ReadError(Exception):
    """The message could not be read."""


# --- message body -----------------------------------------------------------

def encode_lines(segment):
    """Wire form of complete lines (segment ends with LF or a lone CR).

    CRLF stays, a lone LF or a lone CR becomes CRLF, a leading '.' is doubled
    on every line, including one that follows a lone CR: nothing but CRLF ever
    leaves, and no line of the message can end the DATA early."""
    s = segment.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n.", b"\n..")
    if s[:1] == b".":
        s = b"." + s
    return s.replace(b"\n", b"\r\n")


def body_chunks(fd, chunk=READ_CHUNK):
    """Yield the encoded message read from fd, piece by piece (without the final dot).

    Raises PartialLine at the end when the last line has no LF (a trailing lone
    CR ends its line), ReadError when reading fails."""
    carry = bytearray()
    while True:
        try:
            data = os.read(fd, chunk)
        except InterruptedError:
            continue
        except OSError as e:
            raise ReadError(str(e)) from e
        if not data:
            break
        # Only the new bytes and a CR kept back can end a line: a long line is not rescanned.
        start = max(len(carry) - 1, 0)
        carry += data
        # A final CR may be the first half of a CRLF: keep it for the next read.
        limit = len(carry) - 1 if carry[-1] == 0x0D else len(carry)
        cut = max(carry.rfind(b"\n", start, limit), carry.rfind(b"\r", start, limit))
        if cut < 0:
            continue
        segment = bytes(carry[:cut + 1])
        del carry[:cut + 1]
        yield encode_lines(segment)
    if carry:
        if carry[-1] != 0x0D:
            raise PartialLine()
        yield encode_lines(bytes(carry))


# --- the connection ---------------------------------------------------------

class Connection:
    """A connected socket with qmail-remote's per-read/per-write timeout and, if given,
    a deadline (time.monotonic()) for everything."""

    def __init__(self, sock, timeout, deadline=None):
        self.sock = sock
        self.timeout = timeout if timeout > 0 else 0.001
        self.deadline = deadline
        sock.settimeout(self.timeout)
        self._buf = b""
        self._pos = 0
        self.text = bytearray()

    def _bound(self):
        """Before each send or recv: its timeout, shortened to the deadline."""
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Deadline("deadline")
        self.sock.settimeout(min(self.timeout, left))

    def write(self, data):
        view = memoryview(data)
        try:
            while view:
                self._bound()
                n = self.sock.send(view)
                view = view[n:]
        except Deadline:
            raise
        except OSError as e:           # includes timeouts, EPIPE, ECONNRESET
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise Deadline("deadline") from e
            raise Dropped(str(e)) from e

    def _get(self):
        if self._pos >= len(self._buf):
            try:
                self._bound()
                self._buf = self.sock.recv(4096)
            except Deadline:
                raise
            except OSError as e:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    raise Deadline("deadline") from e
                raise Dropped(str(e)) from e
            if not self._buf:
                raise Dropped("EOF")
            self._pos = 0
        ch = self._buf[self._pos]
        self._pos += 1
        if ch != 0x0D and len(self.text) < SMTP_TEXT_MAX:
            self.text.append(ch)
        return ch

    def reply(self):
        """The code of the next reply; its text (CR dropped, capped) is left in .text."""
        self.text = bytearray()
        get = self._get
        code = (get() - 48) * 100
        code += (get() - 48) * 10
        code += get() - 48
        if code < 0:                  # qmail computes in an unsigned long
            code += 1 << 64
        while True:
            ch = get()
            if ch != 0x2D:            # '-'
                break
            while ch != 0x0A:
                ch = get()
            get()
            get()
            get()
        while ch != 0x0A:
            ch = get()
        return code

    def said(self):
        """'Remote host said: {text}' with NUL as '?', or b'' if there is no text.

        The text is used up: a later verdict does not repeat it."""
        if not self.text:
            return b""
        text, self.text = bytes(self.text), bytearray()
        return b"Remote host said: " + text.replace(b"\0", b"?")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def connect(ip_text, port, timeout):
    """(Connection-ready socket, None) or (None, timed_out: bool)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout if timeout > 0 else 0.001)
    try:
        sock.connect((ip_text, port))
    except TimeoutError:
        sock.close()
        return None, True
    except OSError:
        sock.close()
        return None, False
    return sock, None


# --- the dialogue -------------------------------------------------------------

def dialogue(conn, partner, helohost, sender, recipients, messfd, records):
    """Talk to the peer; append r/h/s records to `records`; return the verdict record.

    partner is the peer's address as text (b'1.2.3.4'); sender and recipients
    are already in their SMTP form (quoted local part)."""
    critical = [False]

    def dropped():
        return (b"ZConnected to " + partner + b" but connection died. "
                + (b"Possible duplicate! " if critical[0] else b"") + b"(#4.4.2)\n")

    def outlasted():
        return (b"ZConnected to " + partner + b" but the SMTP session outlasted "
                b"control/timeoutremotesession. "
                + (b"Possible duplicate! " if critical[0] else b"") + b"(#4.4.2)\n")

    def quit(prepend, append):
        conn.deadline = None            # the verdict is known: a late QUIT must not change it
        conn.write(b"QUIT\r\n")       # the peer's answer is not awaited
        return prepend + partner + append + b".\n" + conn.said()

    try:
        try:
            if conn.reply() != 220:
                return quit(b"ZConnected to ", b" but greeting failed")
            conn.write(b"HELO " + helohost + b"\r\n")
            if conn.reply() != 250:
                return quit(b"ZConnected to ", b" but my name was rejected")
            conn.write(b"MAIL FROM:<" + sender + b">\r\n")
            code = conn.reply()
            if code >= 500:
                return quit(b"DConnected to ", b" but sender was rejected")
            if code >= 400:
                return quit(b"ZConnected to ", b" but sender was rejected")
            bother = False
            for recipient in recipients:
                conn.write(b"RCPT TO:<" + recipient + b">\r\n")
                code = conn.reply()
                if code >= 500:
                    records.append(b"h" + partner + b" does not like recipient.\n" + conn.said())
                elif code >= 400:
                    records.append(b"s" + partner + b" does not like recipient.\n" + conn.said())
                else:
                    records.append(b"r")
                    bother = True
            if not bother:
                return quit(b"DGiving up on ", b"")
            conn.write(b"DATA\r\n")
            code = conn.reply()
            if code >= 500:
                return quit(b"D", b" failed on DATA command")
            if code >= 400:
                return quit(b"Z", b" failed on DATA command")
            try:
                pending = None
                for piece in body_chunks(messfd):
                    if pending is not None:
                        conn.write(pending)
                    pending = piece
            except PartialLine:
                return b"DSMTP cannot transfer messages with partial final lines. (#5.6.2)\n"
            except ReadError:
                return b"ZUnable to read message. (#4.3.0)\n"
            conn.write((pending or b"") + b".\r\n")
            # Only once the final dot is out can the peer have taken the message: a
            # failure while the body is still going out cannot cause a duplicate.
            critical[0] = True
            code = conn.reply()
            critical[0] = False
            if code >= 500:
                return quit(b"D", b" failed after I sent the message")
            if code >= 400:
                return quit(b"Z", b" failed after I sent the message")
            return quit(b"K", b" accepted message")
        except Deadline:
            return outlasted()
        except Dropped:
            return dropped()
    finally:
        conn.close()
