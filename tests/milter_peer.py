"""A milter written for the tests (the server side of the milter protocol, version 6), on a
real socket: every connection is served in a thread, every packet it gets is recorded, and
a test's respond(command, data) says what to answer (docs/milter.md).

respond returns a list of (code, data) replies, or one of HANG (answer nothing, keep the
connection), CLOSE (close it), or raw bytes (sent as they are: garbage). None means the
protocol's plain answer: SMFIR_CONTINUE where a reply is due, nothing where none is.
"""
import os
import socket
import struct
import threading

HANG, CLOSE = "hang", "close"
NO_REPLY = {b"A", b"D", b"Q", b"K"}             # abort, macro, quit: the MTA waits for nothing
ALL_ACTIONS = 0x1FF & ~0x20                      # what qmail-smtpd offers (not quarantine)


def pack(code, data=b""):
    return struct.pack(">I", len(data) + 1) + code + data


class MilterPeer:
    def __init__(self, respond=None, actions=ALL_ACTIONS, steps=0, symlists=b"", unix=None):
        self.respond = respond or (lambda command, data: None)
        self.actions, self.steps, self.symlists = actions, steps, symlists
        self.received = []                       # (command, data) in order, every connection
        self.connections = 0
        self.pids = []                           # of each connecting process (unix sockets)
        self.lock = threading.Lock()
        self.closed = threading.Event()          # a connection ended (EOF or CLOSE)
        if unix:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.bind(unix)
            os.chmod(unix, 0o777)
            self.name = "unix:" + unix
        else:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.name = "inet:127.0.0.1:%d" % self.sock.getsockname()[1]
        self.sock.listen(16)
        self.threads = []
        threading.Thread(target=self._accept, daemon=True).start()

    def control_line(self, *settings):
        return " ".join((self.name,) + settings) + "\n"

    def commands(self):
        return [c for c, _ in self.received]

    def data_of(self, command):
        return [d for c, d in self.received if c == command]

    def macros(self, letter):
        """The last SMFIC_MACRO for a command letter, as a dict."""
        found = {}
        for data in self.data_of(b"D"):
            if data[:1] == letter:
                parts = data[1:].split(b"\0")[:-1]
                found = dict(zip(parts[::2], parts[1::2]))
        return found

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                if conn.family == socket.AF_UNIX:
                    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                    self.pids.append(struct.unpack("3i", cred)[0])
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _read(self, conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def _serve(self, conn):
        try:
            while True:
                size = struct.unpack(">I", self._read(conn, 4))[0]
                packet = self._read(conn, size)
                command, data = packet[:1], packet[1:]
                with self.lock:
                    self.received.append((command, data))
                if command == b"O":
                    conn.sendall(pack(b"O", struct.pack(">III", 6, self.actions, self.steps)
                                      + self.symlists))
                    continue
                answer = self.respond(command, data)
                if answer == HANG:
                    conn.recv(1)                 # until the MTA closes
                    return
                if answer == CLOSE:
                    return
                if isinstance(answer, bytes):
                    conn.sendall(answer)
                    continue
                if answer is None:
                    if command in NO_REPLY or self._no_reply(command):
                        continue
                    answer = [(b"c", b"")]
                for code, payload in answer:
                    conn.sendall(pack(code, payload))
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
            self.closed.set()

    def _no_reply(self, command):
        flag = {b"C": 0x1000, b"H": 0x2000, b"M": 0x4000, b"R": 0x8000, b"T": 0x10000,
                b"N": 0x40000, b"B": 0x80000, b"L": 0x80}.get(command, 0)
        return bool(self.steps & flag)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
