"""qmail-qmqpd: QMQP on the local socket (and TCP), queued as qmail-queue would.

Every bad request gets its answer (or the connection closes), leaves nothing in
the queue, and the server goes on serving.
"""
import os
import socket
import subprocess
import threading
import time

import pytest

from conftest import AS_ROOT
from qmailpy.queue.client import QueueClient, ServerSubmission
from qmqpd_harness import QmqpServer, ask, connect, netstring, read_answer, request
from queue_view import leftovers, queued

GOOD = request(b"Subject: hi\n\nhello\n", b"a@example.org", [b"b@example.net", b"c@example.net"])


@pytest.fixture
def server(qmail_home):
    with QmqpServer(qmail_home, "-t", "10") as srv:
        yield srv


def empty_queue(home):
    """Nothing queued and no scratch file left (pid/ included)."""
    return leftovers(home) == [] and os.listdir(os.path.join(home.queue, "pid")) == []


def wait_until(predicate, timeout=30):
    """Poll predicate (a child finishing its cleanup) until true or timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def still_serves(server, home, count):
    answer = ask(server.socket, GOOD)
    assert answer.startswith(b"Kok "), answer
    assert len(queued(home)) == count


@pytest.mark.slow
@pytest.mark.both_backends
def test_a_request_is_queued_for_the_callers_uid(qmail_home, server):
    answer = ask(server.socket, GOOD)
    assert answer.startswith(b"Kok ") and b" qp " in answer, answer
    qp = int(answer.rsplit(b" ", 1)[1])
    [msg] = queued(qmail_home)
    assert (msg.sender, msg.recipients, msg.uid) == (
        b"a@example.org", [b"b@example.net", b"c@example.net"], os.getuid())
    first, rest = msg.mess.split(b"\n", 1)
    assert first.startswith(b"Received: (qmail %d invoked by uid %d); " % (qp, os.getuid()))
    assert rest == b"Subject: hi\n\nhello\n"
    assert os.stat(server.socket).st_mode & 0o777 == 0o666


def test_a_client_that_lacks_queue_rights_gets_qmail_queues_answers(qmail_home, server):
    sub = ServerSubmission(qmail_home.path)
    sub.write(b"x\n")
    result = sub.finish(b"a" * 1003, [b"b@c"])
    assert (result.code, result.permanent, result.text) == (
        11, True, b"envelope address too long for qq (#5.1.3)")
    sub = ServerSubmission(qmail_home.path)
    sub.write(b"x\n")
    result = sub.finish(b"a@b", [b"c@d"])
    assert (result.code, result.ok) == (0, True) and result.pid > 0
    assert [m.recipients for m in queued(qmail_home)] == [[b"c@d"]]


def test_garbage_is_answered_and_nothing_is_queued(qmail_home, server):
    for junk in (b"GET / HTTP/1.0\r\n\r\n", b"12345678901234567890123:x", b"5:abc,,",
                 b"9:3:abc,,,", b"6:3:abc,,"):          # the last has no sender
        assert ask(server.socket, junk, shut=True) == b"Dthat is not a QMQP request (#5.5.2)", junk
    assert ask(server.socket, request(b"m\n", b"a\0b", [b"c@d"])) == \
        b"Dsorry, I can't accept addresses like that (#5.1.3)"
    wait_until(lambda: empty_queue(qmail_home))
    still_serves(server, qmail_home, 1)


def test_a_truncated_netstring_is_answered_and_nothing_is_queued(qmail_home, server):
    assert ask(server.socket, GOOD[:len(GOOD) // 2], shut=True) == \
        b"Zthe QMQP request ended early (#4.3.0)"
    assert ask(server.socket, GOOD[:-1], shut=True) == b"Zthe QMQP request ended early (#4.3.0)"
    wait_until(lambda: empty_queue(qmail_home))
    still_serves(server, qmail_home, 1)


@pytest.mark.slow
@pytest.mark.both_backends
def test_databytes_bounds_qmqp_from_the_network_and_localdatabytes_local_users(qmail_home):
    """As in qmail, databytes is for what arrives from the network; a local user is
    limited only by control/localdatabytes (and qmail's own accounts never)."""
    qmail_home.control("databytes", "1000\n")
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    big = request(b"x" * 1001, b"a@b", [b"c@d"])
    with QmqpServer(qmail_home, "-t", "10", "--tcp", "127.0.0.1:0") as server:
        assert ask(server.tcp, big) == R_SIZE
        assert empty_queue(qmail_home)
        assert ask(server.tcp, request(b"x" * 1000, b"a@b", [b"c@d"])).startswith(b"Kok ")
        assert ask(server.socket, big).startswith(b"Kok ")
        if AS_ROOT:         # root is an ordinary local user of this home (nobody's)
            qmail_home.control("localdatabytes", "1000\n")
            assert ask(server.socket, big) == R_SIZE
            assert ask(server.tcp, big) == R_SIZE
    assert len(queued(qmail_home)) == 2


R_SIZE = b"Dsorry, that message size exceeds my databytes limit (#5.3.4)"


def test_a_client_that_disconnects_mid_message_leaves_nothing(qmail_home, server):
    message = b"y" * 300000
    data = request(message, b"a@b", [b"c@d"])
    with connect(server.socket) as sock:
        sock.sendall(data[:200000])
        mess = os.path.join(qmail_home.queue, "mess")
        # the server streams into mess/ as it reads: the file exists before we leave
        wait_until(lambda: any(os.listdir(os.path.join(mess, d)) for d in os.listdir(mess)))
    wait_until(lambda: empty_queue(qmail_home))
    still_serves(server, qmail_home, 1)


@pytest.mark.slow
def test_a_stalled_client_is_cut_off_at_the_deadline(qmail_home):
    with QmqpServer(qmail_home, "-t", "1") as server:
        with connect(server.socket) as sock:
            sock.sendall(GOOD[:20])
            assert read_answer(sock) == b"Ztimeout reading the QMQP request (#4.4.2)"
        wait_until(lambda: empty_queue(qmail_home))
        still_serves(server, qmail_home, 1)


@pytest.mark.slow
def test_200_concurrent_clients_half_of_them_broken(qmail_home, server):
    socks = [connect(server.socket) for _ in range(200)]
    answers = [None] * 200

    def client(i):
        sock = socks[i]
        try:
            if i % 2:
                sock.sendall(request(b"message %d\n" % i, b"a@b", [b"r%d@x" % i]))
            else:
                sock.sendall(GOOD[:len(GOOD) - 5])
                sock.shutdown(socket.SHUT_WR)
            answers[i] = read_answer(sock)
        finally:
            sock.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(answers[i].startswith(b"Kok ") for i in range(1, 200, 2)), answers
    assert set(answers[0::2]) == {b"Zthe QMQP request ended early (#4.3.0)"}
    got = sorted(m.recipients[0] for m in queued(qmail_home))
    assert got == sorted(b"r%d@x" % i for i in range(1, 200, 2))
    wait_until(lambda: os.listdir(os.path.join(qmail_home.queue, "pid")) == [])
    assert server.alive()
    still_serves(server, qmail_home, 101)


def test_no_server_is_a_temporary_failure_that_names_the_socket(qmail_home):
    sub = ServerSubmission(qmail_home.path)
    sub.write(b"x\n")
    result = sub.finish(b"a@b", [b"c@d"])
    path = os.path.join(qmail_home.path, "run", "qmqp.sock").encode()
    assert (result.code, result.ok, result.permanent) == (74, False, False)
    assert result.text.startswith(b"no queue server at " + path + b": ")
    assert b"is qmail-qmqpd running?" in result.text
    assert empty_queue(qmail_home)


def test_a_server_that_dies_mid_request_is_a_temporary_failure(qmail_home, tmp_path):
    path = str(tmp_path / "dead.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def die():
        conn, _ = listener.accept()
        conn.recv(10)
        conn.close()
    t = threading.Thread(target=die)
    t.start()
    sub = ServerSubmission(qmail_home.path)
    sub.path = path
    sub.write(b"x" * 100)
    result = sub.finish(b"a@b", [b"c@d"])
    t.join()
    listener.close()
    assert (result.code, result.permanent) == (74, False)
    assert result.text.startswith(b"communication with the queue server at ")


def test_tcp_clients_follow_qmqpclients_and_queue_as_qmaild(qmail_home):
    qmail_home.control("qmqpclients", "127.0.0.2:allow\n127.:deny\n")
    with QmqpServer(qmail_home, "--tcp", "127.0.0.1:0") as server:
        assert ask(server.tcp, GOOD) == b""                      # closed, unanswered
        assert empty_queue(qmail_home)
        qmail_home.control("qmqpclients", "127.0.0.1:allow\n:deny\n")
        assert ask(server.tcp, GOOD).startswith(b"Kok ")
    [msg] = queued(qmail_home)
    from qmailpy import privs
    assert msg.uid == privs.account(qmail_home.path, "qmaild").uid


def test_a_tcp_clients_message_is_logged_with_its_address_and_qp(qmail_home):
    """qmail-qmqpd(8) LOG: a null client keeps no log, so the hub's qmail-qmqpd names the
    client and the qp of each message it queued for one (qmail-audit --fleet links by it);
    the local socket's requests, whose uid qmail-send logs, are not logged."""
    from qmailpy import logline
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    with QmqpServer(qmail_home, "--tcp", "127.0.0.1:0") as server:
        answer = ask(server.tcp, GOOD)
        assert ask(server.socket, GOOD).startswith(b"Kok ")
        assert server.stop() == 0
    assert answer.startswith(b"Kok ")
    qp = int(answer.split()[-1])
    assert [line for line in server.stderr.splitlines() if b"qmqp from" in line] == \
        [logline.qmqp_from("127.0.0.1", qp).rstrip(b"\n")]
    assert len(queued(qmail_home)) == 2


def test_an_ipv4_client_of_a_dual_stack_listener_is_logged_by_its_ipv4_address(qmail_home):
    """On [::] an IPv4 client's address is ::ffff:127.0.0.1; the line names 127.0.0.1, as
    the fleet MAP (and tcpserver) name it."""
    from qmailpy import logline
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    with QmqpServer(qmail_home, "--tcp", "[::]:0") as server:
        answer = ask(("127.0.0.1", server.tcp[1]), GOOD)
        assert server.stop() == 0
    assert answer.startswith(b"Kok "), answer
    qp = int(answer.split()[-1])
    assert [line for line in server.stderr.splitlines() if b"qmqp from" in line] == \
        [logline.qmqp_from("127.0.0.1", qp).rstrip(b"\n")]


def test_a_socket_from_systemd_is_used_instead_of_binding(qmail_home, tmp_path):
    if AS_ROOT:
        os.chmod(tmp_path, 0o755)
    path = str(tmp_path / "activated.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(16)
    env = dict(qmail_home.env, LISTEN_FDS="1")

    def as_fd_3():
        os.dup2(listener.fileno(), 3)
        os.environ["LISTEN_PID"] = str(os.getpid())

    # LISTEN_PID must be the server's own pid: a shell sets it, then execs the server.
    server = QmqpServer(qmail_home, env=env, pass_fds=(listener.fileno(),))
    server.proc = None
    proc = subprocess.Popen(["sh", "-c", 'LISTEN_PID=$$ exec qmail-qmqpd'], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, pass_fds=(3,), preexec_fn=lambda: os.dup2(listener.fileno(), 3))
    try:
        line = proc.stderr.readline()
        assert b"listening on " + path.encode() in line, line
        listener.close()
        assert ask(path, GOOD).startswith(b"Kok ")
        assert not os.path.exists(os.path.join(qmail_home.path, "run", "qmqp.sock"))
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()
    assert len(queued(qmail_home)) == 1


@pytest.mark.slow
def test_sigterm_stops_the_server_and_removes_its_socket(qmail_home):
    server = QmqpServer(qmail_home).start()
    assert os.path.exists(server.socket)
    assert server.stop() == 0
    assert not os.path.exists(server.socket)


@pytest.mark.slow
def test_queue_client_uses_the_server_only_without_queue_rights(qmail_home):
    # the test's own account owns this home's queue (or is root): it queues itself
    assert type(QueueClient(qmail_home.path, {})).__name__ == "ForkedQueue"


@pytest.mark.slow
@pytest.mark.both_backends
def test_an_address_with_a_nul_byte_gets_the_servers_answer_without_the_server(qmail_home, server):
    """Through qmail-qmqpd or a forked qmail-queue (a forward, a bounce): an address holding a
    NUL is refused the same way, and nothing is left behind (qmail-queue itself would read a
    broken envelope, exit 91 and leave its files to the 36-hour cleanup)."""
    from qmailpy.queue.client import ForkedQueue
    for client in (ServerSubmission(qmail_home.path), ForkedQueue(qmail_home.path)):
        client.write(b"x\n")
        result = client.finish(b"a@b", [b"c@d", b"e\0f@g"])
        assert (result.permanent, result.text) == (True, b"sorry, I can't accept addresses like that (#5.1.3)")
    wait_until(lambda: empty_queue(qmail_home))


def test_netstring_coding():
    assert netstring(b"abc") == b"3:abc,"
    assert request(b"m", b"s", [b"r"]) == b"12:1:m,1:s,1:r,,"


def parse_request(data, piece):
    """Read one QMQP request with qmail-qmqpd's parser from a socket pair whose other end sends
    it `piece` bytes at a time (so the parser often finds a length cut in two); (message,
    envelope records), or the answer of the failure."""
    import threading
    from qmailpy.queue.server import BadRequest, Request
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)

    def send():
        for start in range(0, len(data), piece):
            try:
                theirs.sendall(data[start:start + piece])
            except OSError:
                return
        theirs.shutdown(socket.SHUT_WR)
    sender = threading.Thread(target=send)
    sender.start()
    request = Request(ours, time.monotonic() + 10)
    try:
        request.read_head(0)
        message = b""
        while True:
            chunk = request.read_message()
            if not chunk:
                break
            message += chunk
        records = []
        while True:
            record = request.read_envelope()
            if not record:
                break
            records.append(record)
        return message, records
    except BadRequest:
        return request.failure
    finally:
        ours.close()
        sender.join()
        theirs.close()


@pytest.mark.parametrize("data", [
    request(b"Subject: x\n\nhi\n", b"a@example.org", [b"b@example.net", b"c@example.net"]),
    b"12:1:m,1:s,1:r,,", b"13:01:m,1:s,1:r,,", b"12:1:m,1:s,1;r,,", b"12:1:m,1:s,x:r,,",
    b"30:" + b"9" * 21 + b":m,1:s,,", b"9:1:m,1:s,1:r,,", b"12:1:m,1:s,:r,,", b"0:,",
])
def test_the_request_parser_reads_the_same_in_any_pieces(data):
    whole = parse_request(data, len(data))
    if data == b"12:1:m,1:s,1:r,,":
        assert whole == (b"m", [b"Fs\0", b"Tr\0", b"\0"])
    elif data.startswith((b"12:1:m,1:s,1;", b"12:1:m,1:s,x", b"30:", b"9:", b"12:1:m,1:s,:")):
        from qmailpy.queue.server import R_SYNTAX
        assert whole == R_SYNTAX
    assert parse_request(data, 1) == whole
    assert parse_request(data, 3) == whole


def test_qmailctl_start_qmqp_refuses_a_queue_server_running_without_that_address(qmail_home):
    """qmailctl start --qmqp ADDRESS while qmail-qmqpd runs without answering there: not
    "already running" and 0 (the administrator would believe the hub answers QMQP), but
    why, and 1; the same address again is already running."""
    from ctl_support import ctl, free_port
    port = free_port()
    here = "127.0.0.1:%d" % port
    try:
        assert ctl(qmail_home, "start").returncode == 0
        hub = ctl(qmail_home, "start", "--qmqp", here)
        assert hub.returncode == 1, hub
        assert ("qmailctl: qmail-qmqpd already running (pid %d), but not with --tcp %s: run "
                "qmailctl stop first\n" % (_pid(qmail_home), here)).encode() in hub.stderr
        assert b"qmail-send already running" in hub.stdout
        assert ctl(qmail_home, "stop").returncode == 0
        assert ctl(qmail_home, "start", "--qmqp", here).returncode == 0
        again = ctl(qmail_home, "start", "--qmqp", here)
        assert again.returncode == 0 and b"qmail-qmqpd already running" in again.stdout, again
        plain = ctl(qmail_home, "start")         # a hub stays a hub: nothing asked of it is missing
        assert plain.returncode == 0 and b"qmail-qmqpd already running" in plain.stdout, plain
        socket.create_connection(("127.0.0.1", port), timeout=30).close()
    finally:
        ctl(qmail_home, "stop")


def _pid(home):
    with open(os.path.join(home.path, "log", "qmail-qmqpd.pid")) as f:
        return int(f.read())
