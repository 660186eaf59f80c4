"""qmail-qmqpc: qmail-queue's interface, but the message goes by QMQP to a hub
(qmail-qmqpc(8)), as qmail's: the message on fd 0, the envelope on fd 1;
control/qmqpservers lists the hubs' addresses, tried in order on port 628, each
connection given CONNECT_TIMEOUT seconds; the next hub is tried only when no
connection could be made. Once connected, each read and write gets IO_TIMEOUT
seconds, and any failure ends it (exit 74): the hub may have queued the message.

Exit codes are qmail-qmqpc.c's: 0 the hub answered K, 31 D, 71 Z; 72 the last hub
tried timed out, 73 it refused; 74 communication failed; 54 the message or the
envelope could not be read; 55 no control/qmqpservers (or no address in it); 61
no home; 91 a malformed envelope.

Beyond qmail: an address may be IPv6, and may carry a port ("192.0.2.1:6628",
"[2001:db8::1]:6628"); the message is held in a Spool (bounded memory), not slurped.
"""
import os

PORT = 628
CONNECT_TIMEOUT = 10
IO_TIMEOUT = 60
CONTROL = "qmqpservers"

OK, PERMANENT, TEMPORARY = 0, 31, 71
READ_ERROR, NO_CONTROL, NO_HOME = 54, 55, 61
CONNECT_TIMED_OUT, CONNECT_REFUSED, COMMUNICATION = 72, 73, 74
ANSWER_CODES = {b"K": OK, b"Z": TEMPORARY, b"D": PERMANENT}


def parse_server(line):
    """(family, address, port) for a qmqpservers line, or None for one that is not an
    IP address (qmail skips those)."""
    # the C module: `import socket` and ipaddress cost a null client's every message
    import _socket
    text = line.decode("ascii", "replace").strip()
    port = PORT
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and (not rest.startswith(":") or not rest[1:].isdigit())):
            return None
        if rest:
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, digits = text.partition(":")
        if not digits.isdigit():
            return None
        port = int(digits)
    else:
        host = text
    if not 0 < port < 65536:
        return None
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        return family, host, port
    return None


def _read_all_to(spool, fd):
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        spool.write(chunk)


class Ended(Exception):
    def __init__(self, code):
        self.code = code


def _send(server, head, spool, tail):
    """(exit code, None) from the hub's answer, or (None, 72 or 73) when no connection
    could be made; Ended(74) when one was made and then failed."""
    import _socket
    family, host, port = server
    sock = _socket.socket(family, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect((host, port))
        except TimeoutError:
            return None, CONNECT_TIMED_OUT
        except OSError:
            return None, CONNECT_REFUSED
        sock.settimeout(IO_TIMEOUT)
        try:
            sock.sendall(head)
            for piece in spool.pieces():
                sock.sendall(piece)
            sock.sendall(tail)
            got = b""
            while True:
                chunk = sock.recv(1024)
                if not chunk:
                    raise Ended(COMMUNICATION)
                got += chunk
                # as qmail-qmqpc.c: the first K, Z or D byte decides (the length is digits)
                for ch in got:
                    code = ANSWER_CODES.get(bytes([ch]))
                    if code is not None:
                        return code, None
                if len(got) > 4096:
                    raise Ended(COMMUNICATION)
        except OSError:
            raise Ended(COMMUNICATION) from None
    finally:
        sock.close()


def run(home):
    """Queue the message on fd 0 with the envelope on fd 1 at a hub; the exit code."""
    from qmailpy.home import ControlError, control_list
    from qmailpy.queue import qmqp
    from qmailpy.queue.spool import Spool, SpoolError
    try:
        os.chdir(home)
    except OSError:
        return NO_HOME
    try:
        lines = control_list(home, CONTROL)
    except ControlError:
        return NO_CONTROL
    if lines is None:
        return NO_CONTROL
    spool = Spool()
    try:
        try:
            _read_all_to(spool, 0)
        except OSError:
            return READ_ERROR
        if spool.error is not None:
            return 53           # qq write error or disk full: the spool could not hold it
        try:
            sender, recipients = qmqp.relay_envelope(lambda: os.read(1, 65536))
        except ValueError as e:
            return e.args[0]        # qmail-queue's code: 91 malformed, 11 too long, 54 cut short
        except OSError:
            return READ_ERROR
        head, tail = qmqp.frame(spool.size, sender, recipients)
        last_error = NO_CONTROL
        for line in lines:
            server = parse_server(line)
            if server is None:
                continue
            try:
                code, error = _send(server, head, spool, tail)
            except Ended as e:
                return e.code
            except SpoolError:
                return READ_ERROR
            if code is not None:
                return code
            last_error = error
        return last_error
    finally:
        spool.close()
