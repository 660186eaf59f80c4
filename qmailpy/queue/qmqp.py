"""QMQP's bytes (qmail-qmqpd(8)): a client's request and the server's answer.

A request is one netstring holding the message's netstring, then the sender's,
then one per recipient: netstring(netstring(message) netstring(sender)
netstring(recipient)...). The answer is one netstring whose first byte is K
(queued), Z (temporary failure) or D (permanent failure), then a text. A
netstring is LENGTH ":" BYTES ",", LENGTH in decimal without leading zeros
(qmail-qmqpd also accepts them).

On the local socket only (qmailpy's, not qmail's), a request may follow option
netstrings, each told apart by its first byte (a letter; a request's is a digit):
netstring("notbefore=" EPOCH) holds the message's delivery until then, netstring("hold")
queues it on hold until `qmailctl queue release` (qmail-qmqpd(8)).

exchange() is the client's side over a local (AF_UNIX) socket.
"""

MAX_ANSWER = 1024        # qmail's answers are a line; a longer one is not an answer


class Unreachable(Exception):
    """No server listens at the socket (missing, refused, no permission)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Failed(Unreachable):
    """The server was reached but gave no valid answer."""


def netstring(data):
    return b"%d:%s," % (len(data), data)


NOT_QMQP = b"Dthat is not a QMQP request (#5.5.2)"      # qmail-qmqpd's answer to a broken request
NOT_BEFORE_OPTION = b"notbefore="
HOLD_OPTION = b"hold"
MAX_OPTION = 64          # bytes of an option netstring's text
MAX_OPTIONS = 2          # option netstrings in one request: each kind at most once


def request(message, sender, recipients, not_before=None, hold=False):
    """The request's bytes; not_before (epoch seconds) and hold add the local socket's options."""
    head, tail = frame(len(message), sender, recipients, not_before, hold)
    return head + message + tail


def frame(size, sender, recipients, not_before=None, hold=False):
    """(head, tail): what goes before and after a message of size bytes in its request,
    so that the message itself can be sent from wherever it is held."""
    options = b"" if not_before is None else netstring(NOT_BEFORE_OPTION + b"%d" % not_before)
    if hold:
        options += netstring(HOLD_OPTION)
    envelope = netstring(sender) + b"".join(netstring(r) for r in recipients)
    inner = len(b"%d" % size) + 1 + size + 1 + len(envelope)
    return options + b"%d:%d:" % (inner, size), b"," + envelope + b","


def parse_option(text):
    """(name, value) of an option netstring's text: ("notbefore", epoch seconds) or
    ("hold", True); ValueError if it is neither."""
    if text == HOLD_OPTION:
        return "hold", True
    value = text[len(NOT_BEFORE_OPTION):]
    if not text.startswith(NOT_BEFORE_OPTION) or not value.isdigit() or len(value) > 12:
        raise ValueError(text)
    return "notbefore", int(value)


def parse_answer(data):
    """The answer's K/Z/D text from a complete netstring; None if data is not one (yet)."""
    colon = data.find(b":")
    if colon <= 0 or colon > 4 or not data[:colon].isdigit():
        return None
    length = int(data[:colon])
    end = colon + 1 + length
    if len(data) < end + 1 or data[end:end + 1] != b"," or length < 1:
        return None
    answer = data[colon + 1:end]
    return answer if answer[:1] in (b"K", b"Z", b"D") else None


def _reason(e):
    return e.strerror or str(e) if isinstance(e, OSError) else str(e)


def exchange(path, data, timeout):
    """Send a request to the server at path; its answer (K/Z/D text).

    data: the request's bytes, or a function that sends them on the socket it is
    given (sendall), so that a large message need not be in memory at once.
    Unreachable when no connection can be made, Failed when the server does
    not answer with a netstring."""
    # the C module: `import socket` (enum, selectors) costs every sendmail about 4 ms
    import _socket
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as e:
            raise Unreachable(_reason(e)) from None
        send_error = None
        try:
            if callable(data):
                data(sock)
            else:
                sock.sendall(data)
        except OSError as e:
            send_error = e          # the server may have answered before it stopped reading
        got = b""
        try:
            while len(got) <= MAX_ANSWER:
                chunk = sock.recv(MAX_ANSWER + 16)
                if not chunk:
                    break
                got += chunk
                if parse_answer(got) is not None:
                    break
        except OSError as e:
            if parse_answer(got) is None:
                raise Failed(_reason(send_error or e)) from None
        answer = parse_answer(got)
        if answer is None:
            if send_error is not None:
                raise Failed(_reason(send_error))
            raise Failed("connection closed without an answer" if not got else "not a QMQP answer")
        return answer
    finally:
        sock.close()


def relay_envelope(read):
    """(sender, recipients) from qmail-queue's envelope format, read with read() until its
    final NUL; ValueError(code) with qmail-queue's exit code: 91 malformed, 11 too long,
    54 ends early (or OSError from read)."""
    from qmailpy.envelope import MAX_ADDRESS
    buf = b""
    pos = 0
    fields = []
    while True:
        if pos < len(buf):
            kind = buf[pos]
            if fields and kind == 0:
                return fields[0], fields[1:]
            if kind != (70 if not fields else 84):       # 'F' first, then 'T'
                raise ValueError(91)
            nul = buf.find(b"\0", pos + 1)
            if nul >= 0:
                if nul - pos - 1 > MAX_ADDRESS:
                    raise ValueError(11)
                fields.append(buf[pos + 1:nul])
                pos = nul + 1
                continue
            if len(buf) - pos - 1 > MAX_ADDRESS:
                raise ValueError(11)
        chunk = read()
        if not chunk:
            raise ValueError(54)
        buf = buf[pos:] + chunk
        pos = 0

