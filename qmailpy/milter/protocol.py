"""The milter wire protocol, version 6 (docs/milter.md "Protocol"): packets, codes, one connection.

A packet is a 32-bit big-endian length (of what follows), a command byte and its
data. Only what a client (the MTA side) needs is here. Imports: socket, struct, time.
"""
import socket
import struct
import time

VERSION = 6
BODY_CHUNK = 65535              # the most body bytes one SMFIC_BODY carries
MAX_PACKET = 1 << 20            # a longer reply is garbage: a milter's reply is small

# commands, MTA -> milter
C_ABORT, C_BODY, C_CONNECT, C_MACRO, C_BODYEOB = b"A", b"B", b"C", b"D", b"E"
C_HELO, C_QUIT_NC, C_HEADER, C_MAIL, C_EOH = b"H", b"K", b"L", b"M", b"N"
C_OPTNEG, C_QUIT, C_RCPT, C_DATA = b"O", b"Q", b"R", b"T"

# replies, milter -> MTA
R_ADDRCPT, R_DELRCPT, R_ADDRCPT_PAR, R_SHUTDOWN = b"+", b"-", b"2", b"4"
R_ACCEPT, R_REPLBODY, R_CONTINUE, R_DISCARD = b"a", b"b", b"c", b"d"
R_CHGFROM, R_CONN_FAIL, R_ADDHEADER, R_INSHEADER = b"e", b"f", b"h", b"i"
R_SETSYMLIST, R_CHGHEADER, R_PROGRESS, R_QUARANTINE = b"l", b"m", b"p", b"q"
R_REJECT, R_SKIP, R_TEMPFAIL, R_REPLYCODE, R_OPTNEG = b"r", b"s", b"t", b"y", b"O"

# actions the MTA allows (SMFIF_*)
F_ADDHDRS, F_CHGBODY, F_ADDRCPT, F_DELRCPT = 0x01, 0x02, 0x04, 0x08
F_CHGHDRS, F_QUARANTINE, F_CHGFROM, F_ADDRCPT_PAR, F_SETSYMLIST = 0x10, 0x20, 0x40, 0x80, 0x100

# protocol steps (SMFIP_*): NO* = do not send it, NR_* = send it but read no reply
P_NOCONNECT, P_NOHELO, P_NOMAIL, P_NORCPT = 0x1, 0x2, 0x4, 0x8
P_NOBODY, P_NOHDRS, P_NOEOH, P_NR_HDR = 0x10, 0x20, 0x40, 0x80
P_NOUNKNOWN, P_NODATA, P_SKIP, P_RCPT_REJ = 0x100, 0x200, 0x400, 0x800
P_NR_CONN, P_NR_HELO, P_NR_MAIL, P_NR_RCPT = 0x1000, 0x2000, 0x4000, 0x8000
P_NR_DATA, P_NR_UNKN, P_NR_EOH, P_NR_BODY = 0x10000, 0x20000, 0x40000, 0x80000
P_HDR_LEADSPC = 0x100000

# What qmail-smtpd offers. Not RCPT_REJ (rejected recipients are not shown to milters).
# QUARANTINE queues the message on hold (docs/milter.md "Actions").
OFFERED_ACTIONS = F_ADDHDRS | F_CHGBODY | F_ADDRCPT | F_DELRCPT | F_CHGHDRS | F_QUARANTINE \
    | F_CHGFROM | F_ADDRCPT_PAR | F_SETSYMLIST
OFFERED_STEPS = 0x1FFFFF & ~P_RCPT_REJ

# macro stages of SMFIR_SETSYMLIST (SMFIM_*), and the SMFIC_MACRO command each belongs to
STAGE_CONNECT, STAGE_HELO, STAGE_MAIL, STAGE_RCPT, STAGE_DATA, STAGE_EOM, STAGE_EOH = range(7)


class MilterError(Exception):
    """The milter is down, slow, closed the connection or said something the protocol lacks."""


def connect(spec):
    """A connected socket to spec (config.Milter), or MilterError."""
    if spec.family == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target = spec.address
    else:
        host, port = spec.address
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise MilterError("cannot resolve %s: %s" % (spec.name, e)) from None
        family, _, _, _, target = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        # small packets, each awaited: without this, Nagle's algorithm and the milter's
        # delayed ACK hold the second of two writes (macros, then their command) ~40 ms
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(spec.connect_timeout)
    try:
        sock.connect(target)
    except OSError as e:
        sock.close()
        raise MilterError("cannot connect to %s: %s" % (spec.name, _why(e))) from None
    return sock


def _why(e):
    return "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))


class Connection:
    """One milter connection: send(command, data), reply(timeout) -> (code, data);
    queue(command, data) holds a packet back until the next send (one write for both)."""

    def __init__(self, spec):
        self.spec = spec
        self.sock = connect(spec)
        self.pending = b""

    def queue(self, command, data=b""):
        self.pending += struct.pack(">I", len(data) + 1) + command + data

    def send(self, command, data=b""):
        packet = self.pending + struct.pack(">I", len(data) + 1) + command + data
        self.pending = b""
        self.sock.settimeout(self.spec.command_timeout)
        try:
            self.sock.sendall(packet)
        except OSError as e:
            raise MilterError("%s: write failed: %s" % (self.spec.name, _why(e))) from None

    def reply(self, timeout):
        """The next reply but SMFIR_PROGRESS (which restarts the wait)."""
        while True:
            code, data = self._packet(timeout)
            if code != R_PROGRESS:
                return code, data

    def _packet(self, timeout):
        head = self._exactly(5, timeout)
        size = struct.unpack(">I", head[:4])[0]
        if not 1 <= size <= MAX_PACKET:
            raise MilterError("%s: a reply of %d bytes" % (self.spec.name, size))
        return head[4:5], self._exactly(size - 1, timeout)

    def _exactly(self, n, timeout):
        data = bytearray()
        until = time.monotonic() + timeout
        while len(data) < n:
            left = until - time.monotonic()
            if left <= 0:
                raise MilterError("%s: timed out after %g seconds" % (self.spec.name, timeout))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(n - len(data), 65536))
            except OSError as e:
                raise MilterError("%s: read failed: %s" % (self.spec.name, _why(e))) from None
            if not chunk:
                raise MilterError("%s: closed the connection" % self.spec.name)
            data += chunk
        return bytes(data)

    def close(self, polite=True):
        if polite:
            try:
                self.sock.settimeout(1)
                self.sock.sendall(struct.pack(">I", 1) + C_QUIT)
            except OSError:
                pass
        self.sock.close()


def strings(data, count=None):
    """NUL-terminated strings of a packet; MilterError when one lacks its NUL."""
    if not data.endswith(b"\0"):
        raise MilterError("a string without its NUL")
    parts = data[:-1].split(b"\0")
    if count is not None and len(parts) != count:
        raise MilterError("%d strings where %d belong" % (len(parts), count))
    return parts


def macros(stage_command, pairs):
    """The SMFIC_MACRO data for a command letter and (name, value) pairs."""
    return stage_command + b"".join(name + b"\0" + value + b"\0" for name, value in pairs)
