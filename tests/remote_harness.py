"""SMTP peers on 127.0.0.1 for the qmail-remote and qmail-rspawn tests.

Smtpd: a real aiosmtpd server in its own thread and event loop, recording
every transaction; its replies to RCPT, DATA and after the final dot can be
scripted. ScriptedPeer: a raw socket server that plays a list of steps
(send bytes, expect a line, read the DATA, hang, close) and records every byte
it received, for misbehaving peers and exact wire checks.
"""
import asyncio
import socket
import threading
import time

from aiosmtpd.smtp import SMTP

WAIT = 30


class Transaction:
    def __init__(self, helo, mail_from, rcpt_tos, data, mail_options=(), tls=None, peer=None):
        self.helo, self.mail_from, self.rcpt_tos, self.data = helo, mail_from, rcpt_tos, data
        self.peer = peer            # the client's address
        self.client = None          # (address, port): tells connections apart
        self.mail_options = list(mail_options)
        self.tls = tls              # (version, cipher) when the session had STARTTLS
        self.smtp_utf8 = False      # MAIL FROM had SMTPUTF8 (aiosmtpd takes it out of mail_options)


class _Handler:
    def __init__(self, owner):
        self.owner = owner

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        reply = self.owner.mail_reply
        if reply:
            return reply
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        reply = self.owner.rcpt_replies.get(address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.owner.in_data.set()
        if self.owner.data_delay:
            await asyncio.sleep(self.owner.data_delay)
        obj = server.transport.get_extra_info("ssl_object")
        tls = (obj.version(), obj.cipher()[0]) if obj is not None else None
        t = Transaction(session.host_name, envelope.mail_from, list(envelope.rcpt_tos),
                        envelope.original_content, envelope.mail_options, tls, session.peer[0])
        t.smtp_utf8 = envelope.smtp_utf8
        t.client = tuple(session.peer[:2])
        self.owner.transactions.append(t)
        return self.owner.data_reply

    async def handle_QUIT(self, server, session, envelope):
        self.owner.quits.append(tuple(session.peer[:2]))
        self.owner.quit_seen.set()
        return "221 Bye"


class Smtpd:
    """aiosmtpd on host:port (random port); use as a context manager. tls_context offers
    STARTTLS (require_starttls: nothing but EHLO, STARTTLS and QUIT before it); smtputf8
    offers SMTPUTF8."""

    def __init__(self, host="127.0.0.1", port=0, tls_context=None, require_starttls=False,
                 smtputf8=False):
        self.transactions = []
        self.quits = []                 # the client (address, port) of each QUIT
        self.quit_seen = threading.Event()
        self.in_data = threading.Event()    # set when a message's dot has arrived
        self.sessions = []              # every SMTP protocol instance, for drop_client()
        self.rcpt_replies = {}
        self.mail_reply = None
        self.data_reply = "250 2.0.0 Ok: queued"
        self.data_delay = 0             # seconds before the reply to the dot
        self.loop = asyncio.new_event_loop()
        handler = _Handler(self)
        def session():
            protocol = SMTP(handler, hostname="peer.test", loop=self.loop, decode_data=False,
                            tls_context=tls_context, require_starttls=require_starttls,
                            enable_SMTPUTF8=smtputf8)
            self.sessions.append(protocol)
            return protocol
        self.server = self.loop.run_until_complete(self.loop.create_server(session, host, port))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def drop_client(self, port):
        """Close, from this side, the connection of the client on that port (a server's idle
        timeout); returns once it is closed."""
        async def drop():
            for protocol in self.sessions:
                transport = protocol.transport
                if transport is not None and transport.get_extra_info("peername")[1] == port:
                    transport.close()
        asyncio.run_coroutine_threadsafe(drop(), self.loop).result(WAIT)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.server.close()
        self.loop.run_until_complete(self.server.wait_closed())
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ScriptedPeer:
    """A one-connection-at-a-time raw SMTP peer playing `script` for each connection.

    Steps: ("send", bytes) writes; ("drip", bytes, seconds) writes one byte at a
    time, `seconds` apart (ending the connection once the client has gone);
    ("line",) reads one line; ("data",) reads up to and including CRLF.CRLF; ("read", n) reads at least n more bytes;
    ("hang",) waits until the client goes away; ("close",) closes (with unread
    bytes pending, the client gets a reset). rcvbuf sets SO_RCVBUF, to bound
    what the client can have in flight. Everything received is in .received
    (one bytes per connection), .done is set after each connection ends."""

    def __init__(self, script, host="127.0.0.1", port=0, backlog=8, rcvbuf=None):
        self.script = script
        self.received = []
        self.connections = 0
        self.done = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((host, port))
        self.sock.listen(backlog)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.stopping:
                conn.close()
                return
            self.connections += 1
            got = bytearray()
            self.received.append(got)
            conn.settimeout(WAIT)
            try:
                self._play(conn, got)
            except OSError:
                pass
            finally:
                conn.close()
                self.received[-1] = bytes(got)
                self.done.set()

    def _read_until(self, conn, got, end):
        start = len(got)
        while end not in got[start:] and not (end == b"\r\n.\r\n" and got[start:start + 3] == b".\r\n"):
            data = conn.recv(65536)
            if not data:
                return False
            got += data
        return True

    def _play(self, conn, got):
        for step in self.script:
            kind = step[0]
            if kind == "send":
                conn.sendall(step[1])
            elif kind == "drip":
                # a client that went away makes a later send fail (EPIPE, ECONNRESET)
                for i in range(len(step[1])):
                    conn.sendall(step[1][i:i + 1])
                    time.sleep(step[2])
            elif kind == "line":
                if not self._read_until(conn, got, b"\n"):
                    return
            elif kind == "data":
                if not self._read_until(conn, got, b"\r\n.\r\n"):
                    return
            elif kind == "read":
                target = len(got) + step[1]
                while len(got) < target:
                    data = conn.recv(65536)
                    if not data:
                        return
                    got += data
            elif kind == "hang":
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    got += data
            elif kind == "close":
                return
        # after the script: collect what the client still sends (QUIT) until it closes
        conn.settimeout(5)
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                got += data
        except OSError:
            return

    def close(self):
        self.stopping = True
        try:
            socket.create_connection((self.host, self.port), timeout=1).close()
        except OSError:
            pass
        self.sock.close()
        self.thread.join(WAIT)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def closed_port():
    """A port on 127.0.0.1 with nothing listening (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def qmail_remote(home, host, sender, *recipients, message=b"Subject: t\n\nhello\n", timeout=60):
    """Run qmail-remote; (exit code, list of records without their NULs)."""
    done = home.run(["qmail-remote", host, sender, *recipients], input=message, timeout=timeout)
    assert done.stderr == b"", done.stderr
    out = done.stdout
    assert out.endswith(b"\0"), out
    return done.returncode, out[:-1].split(b"\0")


def route(home, domain, port, host="127.0.0.1"):
    home.control("smtproutes", "%s:[%s]:%d\n" % (domain, host, port))


def no_bare_line_ends(data):
    """True if every CR in data is followed by LF and every LF preceded by CR."""
    return data.replace(b"\r\n", b"").find(b"\r") < 0 and data.replace(b"\r\n", b"").find(b"\n") < 0
