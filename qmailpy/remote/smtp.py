"""qmail-remote's SMTP client dialogue (docs/delivery.md "SMTP dialogue"), byte for byte.

EHLO, falling back to HELO when the peer does not know EHLO (500 or 502);
STARTTLS when offered (starttls.py, docs/delivery.md "STARTTLS"); MAIL FROM with SMTPUTF8
when an address is not ASCII or the message came in with SMTPUTF8 (smtputf8.py).
Each command is written and its reply read before the next; the reply code
comes from the first line and continuation lines (4th byte '-') are read to the
end. Every read and every write has its own timeout (timeoutremote); not in
qmail, the whole dialogue also has a deadline (timeoutremotesession), so a peer
that drips its replies a byte at a time, each within the timeout, is still left
(class Deadline). The result is a list of
records, each a letter and a text: `r` (recipient accepted), `h`/`s`
(recipient refused permanently / temporarily), then one K, Z or D verdict that
ends the run.
"""
import os
import socket
import time

SMTP_TEXT_MAX = 5000          # HUGESMTPTEXT
READ_FAILED = b"ZUnable to read message. (#4.3.0)\n"
READ_CHUNK = 65536


class Dropped(Exception):
    """The connection broke or timed out."""


class Deadline(Dropped):
    """The dialogue outlasted its deadline."""


class TryNext(Exception):
    """This host cannot take the message now for a reason of TLS; args[0] is its Z
    record, used if no later address does better, args[1] the reason alone."""


class Stale(Exception):
    """A connection kept from an earlier transaction did not answer RSET with 250; it is
    closed, and no transaction was begun on it."""


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


def body_chunks(fd, chunk=READ_CHUNK, prefix=b""):
    """Yield the encoded message read from fd, piece by piece (without the final dot);
    prefix is its start, already read from fd.

    Raises PartialLine at the end when the last line has no LF (a trailing lone
    CR ends its line), ReadError when reading fails."""
    carry = bytearray()
    while True:
        if prefix:
            data, prefix = prefix, b""
        else:
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

    def extensions(self):
        """The keywords (uppercase bytes) of the EHLO reply just read: its lines but the first."""
        lines = bytes(self.text).split(b"\n")[1:]
        return {line[4:].split(b" ", 1)[0].upper() for line in lines if len(line) > 4}

    def starttls(self, context, server_hostname):
        """Handshake on the connection (after the peer's 220 to STARTTLS); .tls describes it
        (the report's TLS line).

        Bytes the peer sent before the handshake are dropped unread: only what
        comes through TLS is believed (the CVE-2011-0411 class, client side).
        Raises Dropped when the handshake fails or times out."""
        import ssl
        self._buf, self._pos = b"", 0
        raw = self.sock
        try:
            self._bound()
            self.sock = context.wrap_socket(raw, server_hostname=server_hostname)
        except Deadline:
            raise
        except ssl.SSLCertVerificationError as e:
            raw.close()
            raise Dropped("certificate: " + (e.verify_message or str(e))) from e
        except (OSError, ValueError) as e:
            raw.close()
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise Deadline("deadline") from e
            reason = getattr(e, "reason", None) or str(e) or type(e).__name__
            raise Dropped(str(reason)) from e
        cipher = self.sock.cipher()
        self.tls = ("TLS: %s %s" % (self.sock.version(), cipher[0] if cipher else "?")).encode()

    tls = None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def connect(ip_text, port, timeout, source=None):
    """(Connection-ready socket, None) or (None, timed_out: bool); source is the local
    address to bind (text, of the same family) or None."""
    family = socket.AF_INET6 if ":" in ip_text else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None, False
    sock.settimeout(timeout if timeout > 0 else 0.001)
    try:
        if source:
            sock.bind((source, 0))
        sock.connect((ip_text, port))
    except TimeoutError:
        sock.close()
        return None, True
    except OSError:
        sock.close()
        return None, False
    return sock, None


# --- the dialogue -------------------------------------------------------------

def giving_up(partner, conn):
    """The verdict a run ends with when the peer refused every recipient: what each refused
    recipient of a transaction with others would have got in a run of its own."""
    return b"DGiving up on " + partner + b".\n" + (conn.tls + b"\n" if conn.tls else b"")


def not_ascii(address):
    return max(address, default=0) >= 0x80


_NO_SMTPUTF8 = (b" does not support SMTPUTF8 and an address is not ASCII: "
                b"553 5.6.7 non-ASCII addresses are not permitted for that recipient. (#5.6.7)\n")


def no_smtputf8(partner):
    """Why an address that is not ASCII cannot go to a peer without SMTPUTF8 (RFC 6531 §3.4)."""
    return b"Sorry, " + partner + _NO_SMTPUTF8


def alone(record, verdict, giving_up_verdict):
    """The records a run for one recipient of a shared transaction would have given alone
    (qmail-rspawn's workers, qmailpy.remote.workerpool): its r/h/s record and the
    transaction's verdict; a recipient the peer refused, its record and "Giving up";
    a UTF-8 recipient refused for want of SMTPUTF8, that reason as the verdict alone."""
    if record[:1] == b"h" and record.endswith(_NO_SMTPUTF8):
        return [b"D" + record[1:]]
    if record[:1] in (b"h", b"s") and giving_up_verdict is not None:
        return [record, giving_up_verdict]
    return [record, verdict]


class Ended(Exception):
    """The run ends with args[0], its verdict record (the QUIT, if any, already sent)."""


class Session:
    """One run of the dialogue on conn: the peer's address (partner, text), the name
    qmail-remote greets with, and whether a dropped connection now could leave the
    message delivered twice (critical: from the final dot to its reply)."""

    def __init__(self, conn, partner, helohost):
        self.conn, self.partner, self.helohost = conn, partner, helohost
        self.critical = False

    def _duplicate(self):
        return b"Possible duplicate! " if self.critical else b""

    def dropped(self):
        return (b"ZConnected to " + self.partner + b" but connection died. "
                + self._duplicate() + b"(#4.4.2)\n")

    def outlasted(self):
        return (b"ZConnected to " + self.partner + b" but the SMTP session outlasted "
                b"control/timeoutremotesession. " + self._duplicate() + b"(#4.4.2)\n")

    def send_quit(self):
        """QUIT, once the verdict is known: neither the deadline nor a failed write may
        change it (a peer gone after accepting the message must not turn K into Z, a
        duplicate without the "Possible duplicate!" warning)."""
        self.conn.deadline = None
        try:
            self.conn.write(b"QUIT\r\n")   # the peer's answer is not awaited
        except Dropped:
            pass

    def verdict(self, prepend, append):
        tls = self.conn.tls + b"\n" if self.conn.tls else b""
        return prepend + self.partner + append + b".\n" + tls + self.conn.said()

    def quit(self, prepend, append):
        self.send_quit()
        return self.verdict(prepend, append)

    def end(self, prepend, append):
        """Ended, with the verdict written after QUIT."""
        return Ended(self.quit(prepend, append))

    def end_on_refusal(self, code, permanent, temporary, append):
        """Ends the run when the reply code is 5xx (verdict prepend: permanent) or 4xx."""
        if code >= 500:
            raise self.end(permanent, append)
        if code >= 400:
            raise self.end(temporary, append)

    def hello(self):
        """The peer's extensions; ends the run when it rejects my name (EHLO, and HELO
        when it does not know EHLO: 500 or 502)."""
        conn = self.conn
        conn.write(b"EHLO " + self.helohost + b"\r\n")
        code = conn.reply()
        if code == 250:
            return conn.extensions()
        if code in (500, 502):
            conn.write(b"HELO " + self.helohost + b"\r\n")
            if conn.reply() == 250:
                return set()
        raise self.end(b"ZConnected to ", b" but my name was rejected")


def _opening(session, reused, policy, use_tls):
    """The peer's extensions once greeting, EHLO and STARTTLS (remote/starttls.py) are
    behind; on a kept connection (reused: its extensions), once RSET has its 250."""
    conn = session.conn
    if reused is not None:
        try:
            conn.write(b"RSET\r\n")
            alive = conn.reply() == 250
        except Dropped:
            alive = False
        if not alive:
            raise Stale()
        return reused                       # TLS, if any, is already up
    if conn.reply() != 220:
        raise session.end(b"ZConnected to ", b" but greeting failed")
    ext = session.hello()
    required = policy is not None and policy.required
    if (b"STARTTLS" in ext and use_tls) or required:
        from qmailpy.remote import starttls
        ext = starttls.negotiate(session, ext, policy)
    return ext


def _mail_parameters(session, ext, sender, recipients, message):
    """MAIL FROM's parameters; ends the run when the message cannot go to a peer
    without SMTPUTF8 (its sender or every recipient not ASCII, or its header needs it)."""
    if b"SMTPUTF8" in ext:
        if (any(not_ascii(r) for r in recipients) or not_ascii(sender)
                or (message is not None and message.flagged)):
            return b" SMTPUTF8"
        return b""
    if not_ascii(sender) or all(not_ascii(r) for r in recipients):
        session.send_quit()
        raise Ended(b"D" + no_smtputf8(session.partner))
    if message is not None and message.needs_smtputf8:
        session.send_quit()
        raise Ended(b"DSorry, " + session.partner + b" does not support SMTPUTF8, which the "
                    b"message needs: it came in with SMTPUTF8 and its header is not ASCII. "
                    b"(#5.6.7)\n")
    return b""


def _recipients(session, recipients, refuse_utf8, records):
    """RCPT TO for each recipient, its r/h/s record appended; ends the run when none
    is accepted. refuse_utf8: a recipient not ASCII among ASCII ones (qmail-rspawn's
    workers put a message's recipients at one domain in one run) is refused alone."""
    conn, partner = session.conn, session.partner
    accepted = False
    for recipient in recipients:
        if refuse_utf8 and not_ascii(recipient):
            records.append(b"h" + no_smtputf8(partner))
            continue
        conn.write(b"RCPT TO:<" + recipient + b">\r\n")
        code = conn.reply()
        if code >= 500:
            records.append(b"h" + partner + b" does not like recipient.\n" + conn.said())
        elif code >= 400:
            records.append(b"s" + partner + b" does not like recipient.\n" + conn.said())
        else:
            records.append(b"r")
            accepted = True
    if not accepted:
        session.send_quit()
        raise Ended(giving_up(partner, conn) + conn.said())


def _data(session, messfd, message):
    """DATA, the message and its final dot; returns once the peer has accepted it."""
    conn = session.conn
    conn.write(b"DATA\r\n")
    session.end_on_refusal(conn.reply(), b"D", b"Z", b" failed on DATA command")
    try:
        pending = None
        for piece in body_chunks(messfd, prefix=message.prefix if message else b""):
            if pending is not None:
                conn.write(pending)
            pending = piece
    except PartialLine:
        raise Ended(b"DSMTP cannot transfer messages with partial final lines. (#5.6.2)\n")
    except ReadError:
        raise Ended(READ_FAILED)
    conn.write((pending or b"") + b".\r\n")
    # Only once the final dot is out can the peer have taken the message: a
    # failure while the body is still going out cannot cause a duplicate.
    session.critical = True
    code = conn.reply()
    session.critical = False
    session.end_on_refusal(code, b"D", b"Z", b" failed after I sent the message")


def dialogue(conn, partner, helohost, sender, recipients, messfd, records, policy=None,
             use_tls=True, message=None, reused=None, keep=None):
    """Talk to the peer; append r/h/s records to `records`; return the verdict record.

    partner is the peer's address as text (b'1.2.3.4'); sender and recipients
    are already in their SMTP form (quoted local part); policy is a
    remote.tls.Policy (None: opportunistic); message a remote.smtputf8.Message
    (None: not flagged, nothing read yet). Raises TryNext when TLS fails or is
    required and not offered: the next address may do. use_tls=False: no STARTTLS
    even when offered (the clear retry after an opportunistic TLS failure).

    reused: the EHLO extensions of a connection kept open after an earlier
    transaction (greeting, EHLO and STARTTLS are behind it): RSET goes first, and
    Stale is raised when it is not answered 250. keep(conn, extensions): called
    instead of QUIT once the peer has accepted the message; the connection is then
    left open for the next transaction."""
    session = Session(conn, partner, helohost)
    kept = False
    try:
        ext = _opening(session, reused, policy, use_tls)
        mail_params = _mail_parameters(session, ext, sender, recipients, message)
        conn.write(b"MAIL FROM:<" + sender + b">" + mail_params + b"\r\n")
        session.end_on_refusal(conn.reply(), b"DConnected to ", b"ZConnected to ",
                               b" but sender was rejected")
        _recipients(session, recipients, b"SMTPUTF8" not in ext, records)
        _data(session, messfd, message)
        if keep is None:
            return session.quit(b"K", b" accepted message")
        accepted = session.verdict(b"K", b" accepted message")
        kept = True
        keep(conn, ext)
        return accepted
    except Ended as e:
        return e.args[0]
    except Deadline:
        return session.outlasted()
    except Dropped:
        return session.dropped()
    finally:
        if not kept:
            conn.close()
