"""qmail-qmtpd on a real TCP connection (as tcpserver runs it): per-recipient K/Z/D
netstrings with qmail-qmtpd.c's texts, qmail-smtpd's rcpthosts/RELAYCLIENT rules,
databytes, and malformed requests ending the session with nothing queued."""
import os
import re
import socket
import subprocess
import threading

import pytest

from queue_view import leftovers, queued


def ns(data):
    return b"%d:%s," % (len(data), data)


def request(message, sender, recipients, crlf=False):
    body = (b"\r" + message.replace(b"\n", b"\r\n")) if crlf else b"\n" + message
    return ns(body) + ns(sender) + ns(b"".join(ns(r) for r in recipients))


class Qmtp:
    def __init__(self, home, **extra):
        server = socket.create_server(("127.0.0.1", 0))
        self.sock = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        server.close()
        env = dict(home.env)
        env.pop("RELAYCLIENT", None)
        env.update(extra)
        self.proc = subprocess.Popen(["qmail-qmtpd"], stdin=conn, stdout=conn, env=env)
        conn.close()
        self.sock.settimeout(60)
        self.file = self.sock.makefile("rb")

    def replies(self, count):
        out = []
        for _ in range(count):
            digits = b""
            while True:
                ch = self.file.read(1)
                assert ch, "connection closed after %r" % out
                if ch == b":":
                    break
                digits += ch
            text = self.file.read(int(digits))
            assert self.file.read(1) == b","
            out.append(text)
        return out

    def finish(self):
        self.sock.shutdown(socket.SHUT_WR)
        rest = self.file.read()
        self.sock.close()
        return self.proc.wait(60), rest


@pytest.fixture
def home(qmail_home):
    qmail_home.control("rcpthosts", "test.example\n")
    qmail_home.control("databytes", "1000\n")
    return qmail_home


MESSAGE = b"Subject: qmtp\n\nline one\n.dot\n"


def test_per_recipient_replies_and_the_message_queued(home):
    q = Qmtp(home, TCPREMOTEIP="192.0.2.9", TCPREMOTEHOST="peer.example", TCPLOCALHOST="mx.test.example")
    q.sock.sendall(request(MESSAGE, b"a@example.org",
                           [b"u@test.example", b"v@elsewhere.example", b"x" * 1000 + b"@test.example",
                            b"w@TEST.example"]))
    ok, domain, long, ok2 = q.replies(4)
    assert re.fullmatch(rb"Kok \d+ qp \d+", ok) and ok2 == ok
    assert domain == b"Dsorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)"
    assert long == b"Dsorry, I can't handle that recipient (#5.1.3)"
    # a second request on the same connection, CRLF form
    q.sock.sendall(request(MESSAGE, b"", [b"u@test.example"], crlf=True))
    assert q.replies(1)[0].startswith(b"Kok ")
    assert q.finish() == (0, b"")
    second, first = sorted(queued(home), key=lambda m: m.sender)   # numbers are not in order
    assert (first.sender, first.recipients) == (b"a@example.org", [b"u@test.example", b"w@TEST.example"])
    received = re.match(rb"Received: \(qmail \d+ invoked [^\n]*\n(Received: [^\n]*\n  [^\n]*\n)", first.mess)
    assert re.fullmatch(rb"Received: from peer\.example \(192\.0\.2\.9\)\n  by mx\.test\.example with QMTP;"
                        rb" [^\n]+\n", received.group(1)), first.mess
    assert first.body_after_received() == MESSAGE
    assert (second.sender, second.recipients) == (b"", [b"u@test.example"])
    assert second.body_after_received() == MESSAGE


def test_relayclient_and_bad_sender(home):
    q = Qmtp(home, RELAYCLIENT="@relay.example")
    q.sock.sendall(request(MESSAGE, b"a@example.org", [b"v@elsewhere.example"]))
    assert q.replies(1)[0].startswith(b"Kok ")
    q.sock.sendall(request(MESSAGE, b"bad\0sender", [b"v@elsewhere.example", b"u@x"]))
    assert q.replies(2) == [b"Dunacceptable sender (#5.1.7)"] * 2
    assert q.finish()[0] == 0
    (only,) = queued(home)
    assert only.recipients == [b"v@elsewhere.example@relay.example"]


@pytest.mark.slow
def test_a_length_over_databytes_is_refused_and_queues_nothing(home):
    q = Qmtp(home)
    big = b"Subject: big\n\n" + b"y" * 2000 + b"\n"
    q.sock.sendall(request(big, b"a@example.org", [b"u@test.example", b"v@test.example"]))
    assert q.replies(2) == [b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"] * 2
    # CRLF form: counted after CRLF -> LF, and DATABYTES overrides the control file
    q.sock.sendall(request(big, b"a@example.org", [b"u@test.example"], crlf=True))
    assert q.replies(1) == [b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"]
    # too big and an unacceptable sender: qmail-qmtpd.c answers the size
    q.sock.sendall(request(big, b"bad\0sender", [b"u@test.example"]))
    assert q.replies(1) == [b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"]
    assert q.finish()[0] == 0
    assert queued(home) == []
    q = Qmtp(home, DATABYTES="0")
    q.sock.sendall(request(big, b"a@example.org", [b"u@test.example"], crlf=True))
    assert q.replies(1)[0].startswith(b"Kok ")
    q.finish()


@pytest.mark.slow
@pytest.mark.parametrize("data, code", [
    (ns(b"\nSubject: cut\n\nbody\n") + ns(b"a@example.org") + b"20:5:u@te", 0),  # connection closed
    (b"12:\nSubject: x\n", 0),                                       # message cut short
    (ns(b"\nx\n") + b"x" + ns(b"") + ns(ns(b"u@test.example")), 100),   # no comma
    (b"4x:\nabc,", 100),                                             # not a length
    (ns(b"Xbad format"), 100),                                       # neither \n nor \r
    (ns(b"\nx\n") + ns(b"a@b") + b"5:20:u@,", 100),                  # recipient longer than its list
    (b"0:,", 100),
])
def test_a_malformed_or_truncated_request_queues_nothing(home, data, code):
    q = Qmtp(home)
    q.sock.sendall(data)
    assert q.finish() == (code, b"")
    assert leftovers(home) == []


def test_unreadable_controls_end_the_session_with_111(home):
    os.unlink(os.path.join(home.path, "control", "rcpthosts"))
    os.mkdir(os.path.join(home.path, "control", "rcpthosts"))
    q = Qmtp(home)          # it reads its controls before the first request
    assert q.finish() == (111, b"")
    assert leftovers(home) == []


@pytest.mark.slow
@pytest.mark.parametrize("data", [
    b"9999999999:",                                                  # past qmail's 200000000
    b"0" * 5000 + b"9999999999:",                                    # however many zeros lead
    ns(b"\nx\n") + ns(b"a@b") + b"9000:" + b"0" * 4990 + b"9999999999:",  # a recipient's length
])
def test_a_netstring_length_past_qmails_limit_ends_the_session_with_111(home, data):
    q = Qmtp(home)
    q.sock.sendall(data)
    assert q.finish() == (111, b"")
    assert leftovers(home) == []


@pytest.mark.slow
def test_a_huge_recipient_list_is_answered_in_bounded_memory(home):
    """Each recipient costs a byte until the replies, which go out as they are made: 250000
    recipients (about 6 MB of list, 15 MB of replies) held qmail-qmtpd at 78 MB before."""
    count = 250000
    q = Qmtp(home)
    rcpts = b"".join(ns(b"u%d@elsewhere.example" % i) for i in range(count))
    data = ns(b"\n" + MESSAGE) + ns(b"a@b") + ns(rcpts)
    sender = threading.Thread(target=q.sock.sendall, args=(data,))
    sender.start()
    assert q.replies(1) == [b"Dsorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)"]
    with open("/proc/%d/status" % q.proc.pid) as f:
        peak_kb = int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
    assert len(q.replies(count - 1)) == count - 1
    sender.join()
    assert q.finish() == (0, b"")
    assert peak_kb < 40000, peak_kb
    assert leftovers(home) == []
