"""qmail-popup and qmail-pop3d on real TCP connections, with the bytes qmail-popup.c and
qmail-pop3d.c write (docs: man/qmail-popup.8, man/qmail-pop3d.8)."""
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time

import psutil
import pytest

from pop3_helpers import AS_ROOT, Mailbox, Session
from tls_certs import make_certs

FIRST = b"Subject: one\nFrom: a@example.com\n\nbody 1\n.dotted\n..two dots\nlast line\n"
SECOND = b"Subject: two\n\nno final newline"


@pytest.fixture
def mailbox(qmail_home):
    box = Mailbox(qmail_home)
    box.deliver("1000.1.test", FIRST, 1000)
    box.deliver("2000.2.test", SECOND, 2000)
    return box


def test_the_full_command_set_answers_as_qmail(mailbox):
    for name, age in (("stale", 36 * 3600 + 60), ("fresh", 60)):     # maildir_clean's 36 hours
        path = os.path.join(mailbox.maildir, "tmp", name)
        open(path, "wb").close()
        os.utime(path, (time.time() - age, time.time() - age))
        mailbox.chown(path)
    s = Session(mailbox)
    greeting = s.line()
    assert re.fullmatch(rb"\+OK <%d\.\d+@test\.example>\r\n" % s.proc.pid, greeting)
    assert s.cmd("STAT") == b"-ERR authorization first\r\n"
    assert s.cmd("PASS x") == b"-ERR USER first\r\n"
    assert s.cmd("USER") == b"-ERR syntax error\r\n"
    assert s.cmd("NOOP") == b"+OK \r\n"
    assert s.cmd("user alice") == b"+OK \r\n"
    assert s.cmd("pass s3cret") == b"+OK \r\n"
    total = len(FIRST) + len(SECOND)
    assert s.cmd("STAT") == b"+OK 2 %d\r\n" % total
    s.send(b"LIST\r\n")
    assert s.multiline() == b"+OK \r\n1 %d\r\n2 %d\r\n.\r\n" % (len(FIRST), len(SECOND))
    assert s.cmd("LIST 2") == b"+OK 2 %d\r\n" % len(SECOND)
    s.send(b"UIDL\r\n")
    assert s.multiline() == b"+OK \r\n1 1000.1.test\r\n2 2000.2.test\r\n.\r\n"
    assert s.cmd("UIDL 1") == b"+OK 1 1000.1.test\r\n"
    s.send(b"TOP 1 2\r\n")
    assert s.multiline() == (b"+OK \r\nSubject: one\r\nFrom: a@example.com\r\n\r\nbody 1\r\n"
                             b"..dotted\r\n\r\n.\r\n")
    s.send(b"TOP 1 0\r\n")
    assert s.multiline() == b"+OK \r\nSubject: one\r\nFrom: a@example.com\r\n\r\n\r\n.\r\n"
    s.send(b"RETR 1\r\n")
    assert s.multiline() == (b"+OK \r\nSubject: one\r\nFrom: a@example.com\r\n\r\nbody 1\r\n"
                             b"..dotted\r\n...two dots\r\nlast line\r\n\r\n.\r\n")
    s.send(b"RETR 2\r\n")
    assert s.multiline() == b"+OK \r\nSubject: two\r\n\r\nno final newline\r\n\r\n.\r\n"
    assert s.cmd("RETR 0") == b"-ERR messages are counted from 1\r\n"
    assert s.cmd("RETR 3") == b"-ERR not that many messages\r\n"
    assert s.cmd("RETR x") == b"-ERR syntax error\r\n"
    assert s.cmd("DELE") == b"-ERR syntax error\r\n"
    assert s.cmd("LAST") == b"+OK 0\r\n"
    assert s.cmd("DELE 1") == b"+OK \r\n"
    assert s.cmd("DELE 1") == b"-ERR already deleted\r\n"
    assert s.cmd("RETR 1") == b"-ERR already deleted\r\n"
    assert s.cmd("LAST") == b"+OK 1\r\n"
    # qmail counts every message, the size only of those left
    assert s.cmd("STAT") == b"+OK 2 %d\r\n" % len(SECOND)
    s.send(b"LIST\r\n")
    assert s.multiline() == b"+OK \r\n2 %d\r\n.\r\n" % len(SECOND)
    assert s.cmd("RSET") == b"+OK \r\n"
    assert s.cmd("LAST") == b"+OK 0\r\n"
    assert s.cmd("CAPA") == b"-ERR unimplemented\r\n"
    assert s.cmd("NOOP") == b"+OK \r\n"
    assert s.cmd("DELE 2") == b"+OK \r\n"
    assert mailbox.names("new") == ["1000.1.test", "2000.2.test"]   # nothing before QUIT
    assert s.cmd("QUIT") == b"+OK \r\n"
    assert s.line() == b""
    assert s.close() == 1           # qmail-popup's exit status, whatever happened
    assert mailbox.names("new") == []
    assert mailbox.names("cur") == ["1000.1.test:2,"]
    assert mailbox.names("tmp") == ["fresh"]


@pytest.mark.slow
def test_a_wrong_password_ends_the_session_and_changes_nothing(mailbox):
    s = Session(mailbox)
    s.line()
    assert s.cmd("USER alice") == b"+OK \r\n"
    assert s.cmd("PASS wrong") == b"-ERR authorization failed\r\n"
    assert s.line() == b""
    assert s.close() == 1
    s = Session(mailbox)
    s.line()
    assert s.cmd("APOP alice 0123456789abcdef") == b"-ERR authorization failed\r\n"
    assert s.close() == 1
    assert mailbox.names("new") == ["1000.1.test", "2000.2.test"]


@pytest.mark.slow
def test_a_message_deleted_or_moved_by_another_session(mailbox):
    a, b = Session(mailbox), Session(mailbox)
    a.login()
    b.login()
    assert a.cmd("DELE 1") == b"+OK \r\n"
    assert a.cmd("QUIT") == b"+OK \r\n"          # 1 removed, 2 moved to cur/
    a.close()
    assert mailbox.names("cur") == ["2000.2.test:2,"]
    assert b.cmd("RETR 1") == b"-ERR unable to open that message\r\n"
    b.send(b"RETR 2\r\n")                          # found where the other session put it
    assert b.multiline().startswith(b"+OK \r\nSubject: two\r\n")
    assert b.cmd("DELE 1") == b"+OK \r\n"
    assert b.cmd("DELE 2") == b"+OK \r\n"
    assert b.cmd("QUIT") == b"+OK \r\n"
    b.close()
    assert mailbox.names("new") == mailbox.names("cur") == []


@pytest.mark.slow
def test_a_maildir_the_user_cannot_write_or_read(mailbox):
    for sub in ("new", "cur"):
        os.chmod(os.path.join(mailbox.maildir, sub), 0o500)
    s = Session(mailbox)
    s.login()
    assert s.cmd("DELE 1") == b"+OK \r\n"
    assert s.cmd("QUIT") == b"-ERR unable to unlink all deleted messages\r\n"
    assert s.line() == b"+OK \r\n"
    s.close()
    assert mailbox.names("new") == ["1000.1.test", "2000.2.test"]
    os.chmod(os.path.join(mailbox.maildir, "cur"), 0)
    s = Session(mailbox)
    s.line()
    s.cmd("USER alice")
    assert s.cmd("PASS s3cret") == b"-ERR unable to scan $HOME/Maildir\r\n"
    s.close()
    os.rename(mailbox.maildir, mailbox.maildir + ".gone")
    s = Session(mailbox)
    s.line()
    s.cmd("USER alice")
    assert s.cmd("PASS s3cret") == b"-ERR this user has no $HOME/Maildir\r\n"
    s.close()


def test_a_client_that_disconnects_mid_retr_loses_nothing(mailbox):
    big = b"Subject: big\n\n" + b"x" * 999 + b"\n"
    mailbox.deliver("3000.3.test", big * 4000, 3000)
    s = Session(mailbox)
    s.login()
    assert s.cmd("DELE 1") == b"+OK \r\n"
    s.send(b"RETR 3\r\n")
    assert s.line() == b"+OK \r\n"
    s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                      b"\1\0\0\0\0\0\0\0")      # a reset, as a client that crashed
    s.close()
    assert mailbox.names("new") == ["1000.1.test", "2000.2.test", "3000.3.test"]
    assert mailbox.names("cur") == []


@pytest.mark.slow
def test_usage_and_root(qmail_home, mailbox):
    s = Session(mailbox, argv=["qmail-popup", "test.example"])
    assert s.line() == b"-ERR usage: popup hostname subprogram\r\n"
    assert s.close() == 1
    r = qmail_home.run(["qmail-pop3d"], cwd=mailbox.path,
                       **({"user": qmail_home.uid, "group": qmail_home.gid} if AS_ROOT else {}))
    assert (r.returncode, r.stdout) == (0, b"-ERR this user has no $HOME/Maildir\r\n")
    if AS_ROOT:
        r = qmail_home.run(["qmail-pop3d", mailbox.maildir])
        assert (r.returncode, r.stderr) == (1, b"qmail-pop3d invoked as uid 0, terminating\n")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(str(tmp_path_factory.mktemp("certs")))


def _starttls(s, certs):
    assert s.cmd("STLS") == b"+OK begin TLS negotiation\r\n"
    s.file.close()
    s.sock = certs.client_context().wrap_socket(s.sock, server_hostname="localhost")
    s.file = s.sock.makefile("rb")


@pytest.mark.slow
def test_stls_with_the_smtp_certificate_and_required_before_user(qmail_home, mailbox, certs):
    qmail_home.control("servercert.pem", certs.server_bytes())
    qmail_home.control("pop3requiretls", "1\n")
    s = Session(mailbox, TCPREMOTEIP="192.0.2.7")
    s.line()
    s.send(b"CAPA\r\n")
    assert s.multiline() == b"+OK capability list follows\r\nTOP\r\nUIDL\r\nSTLS\r\n.\r\n"
    assert s.cmd("USER alice") == b"-ERR use STLS first\r\n"
    assert s.cmd("PASS s3cret") == b"-ERR use STLS first\r\n"
    _starttls(s, certs)
    assert s.cmd("STLS") == b"-ERR TLS not available\r\n"
    assert s.cmd("USER alice") == b"+OK \r\n"
    assert s.cmd("PASS s3cret") == b"+OK \r\n"
    assert s.cmd("STAT") == b"+OK 2 %d\r\n" % (len(FIRST) + len(SECOND))
    s.send(b"RETR 2\r\n")
    assert s.multiline() == b"+OK \r\nSubject: two\r\n\r\nno final newline\r\n\r\n.\r\n"
    assert s.cmd("DELE 2") == b"+OK \r\n"
    assert s.cmd("QUIT") == b"+OK \r\n"
    assert s.line() == b""
    s.close()
    assert mailbox.names("cur") == ["1000.1.test:2,"]
    # from a loopback address the administrator's rule does not apply
    s = Session(mailbox)
    s.login()
    s.close()


def test_commands_pipelined_behind_stls_are_dropped(qmail_home, mailbox, certs):
    qmail_home.control("servercert.pem", certs.server_bytes())
    s = Session(mailbox)
    s.line()
    s.send(b"STLS\r\nUSER alice\r\n")
    # Read by qmail-popup with the STLS line, USER is dropped; arrived after it, it is taken
    # for the TLS handshake, which fails: either way it never counts inside TLS.
    try:
        _starttls(s, certs)
    except (ssl.SSLError, OSError):
        assert s.close() == 1
        return
    assert s.cmd("PASS s3cret") in (b"-ERR USER first\r\n", b"")
    s.close()


@pytest.mark.skipif(shutil.which("tcpserver") is None, reason="tcpserver is not installed (ucspi-tcp)")
def test_under_tcpserver_as_qmail_documents_it(mailbox):
    proc = subprocess.Popen(["tcpserver", "-v", "-RHl0", "127.0.0.1", "0", "qmail-popup", "test.example",
                             mailbox.checkpw, "qmail-pop3d", "Maildir"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=mailbox.env(), start_new_session=True)
    try:
        assert proc.stderr.readline() == b"tcpserver: status: 0/40\n"     # bound and listening
        (port,) = [c.laddr.port for c in psutil.Process(proc.pid).net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN]
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            f = sock.makefile("rb")
            assert re.fullmatch(rb"\+OK <\d+\.\d+@test\.example>\r\n", f.readline())
            for line, reply in ((b"USER alice", b"+OK \r\n"), (b"PASS s3cret", b"+OK \r\n"),
                                (b"STAT", b"+OK 2 %d\r\n" % (len(FIRST) + len(SECOND))),
                                (b"DELE 1", b"+OK \r\n"), (b"QUIT", b"+OK \r\n")):
                sock.sendall(line + b"\r\n")
                assert f.readline() == reply
            assert f.read() == b""
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()
    assert mailbox.names("new") == [] and mailbox.names("cur") == ["2000.2.test:2,"]


def test_unreadable_controls_are_answered_before_the_greeting(qmail_home, mailbox):
    os.mkdir(os.path.join(qmail_home.path, "control", "pop3requiretls"))
    s = Session(mailbox)
    assert s.line() == b"-ERR unable to read controls\r\n"
    assert s.line() == b""
    assert s.close() == 1


# qmail-pop3d on a TCP connection, its 1200 s timeouts shortened to 2 (Conn's default
# argument). Its send buffer is fixed at 16 kB, as a small net.ipv4.tcp_wmem leaves it
# (on loopback autotuning grows it until a polled-writable socket takes 64 kB whole).
SHORT_TIMEOUT_POP3D = ("import sys; from qmailpy.pop3 import conn, pop3d; "
                       "conn.Conn.__init__.__defaults__ = (0, 1, 2); "
                       "sys.exit(pop3d.main([sys.argv[1].encode()]))")


def _pop3d(mailbox):
    server = socket.create_server(("127.0.0.1", 0))
    ours = socket.socket()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ours.connect(server.getsockname())
    theirs, _ = server.accept()
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    server.close()
    ids = {"user": mailbox.home.uid, "group": mailbox.home.gid} if AS_ROOT else {}
    proc = subprocess.Popen([sys.executable, "-c", SHORT_TIMEOUT_POP3D, mailbox.maildir],
                            stdin=theirs, stdout=theirs, env=mailbox.env(), **ids)
    theirs.close()
    ours.settimeout(60)
    return ours, proc


@pytest.mark.slow
def test_a_client_that_stops_reading_mid_retr_is_dropped_after_the_timeout(mailbox):
    mailbox.deliver("3000.3.test", b"Subject: big\n\n" + (b"x" * 999 + b"\n") * 8000, 3000)
    sock, proc = _pop3d(mailbox)
    sock.sendall(b"DELE 1\r\nRETR 3\r\n")      # and never reads the 8 MB
    try:
        assert proc.wait(60) == 0              # blocked in write() for good before
    finally:
        proc.kill()
    sock.close()
    assert mailbox.names("new") == ["1000.1.test", "2000.2.test", "3000.3.test"]


@pytest.mark.slow
def test_a_message_without_line_ends_is_sent_in_bounded_memory(mailbox):
    long_line = b"a" * 65535 + b"." * 10       # a '.' inside a line is never doubled
    tail = b"y" * (32 << 20)                   # 32 MB, no LF at all
    mailbox.deliver("3000.3.test", b"Subject: long\n\n" + long_line + b"\n.x\n" + tail, 3000)
    sock, proc = _pop3d(mailbox)
    f = sock.makefile("rb")
    assert f.readline() == b"+OK \r\n"
    sock.sendall(b"RETR 3\r\n")
    expected = (b"+OK \r\nSubject: long\r\n\r\n" + long_line + b"\r\n..x\r\n" + tail
                + b"\r\n\r\n.\r\n")
    assert f.read(len(expected)) == expected
    with open("/proc/%d/status" % proc.pid) as status:
        peak_kb = int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
    sock.sendall(b"QUIT\r\n")
    assert f.read() == b"+OK \r\n"
    assert proc.wait(60) == 0
    assert peak_kb < 40000, peak_kb


@pytest.mark.slow
def test_a_fifo_in_the_maildir_reads_as_an_empty_message(mailbox):
    fifo = os.path.join(mailbox.maildir, "new", "3000.3.test")
    os.mkfifo(fifo)
    os.utime(fifo, (3000, 3000))
    mailbox.chown(fifo)
    sock, proc = _pop3d(mailbox)
    sock.settimeout(20)
    f = sock.makefile("rb")
    assert f.readline() == b"+OK \r\n"
    sock.sendall(b"RETR 3\r\nQUIT\r\n")
    try:
        assert f.read() == b"+OK \r\n\r\n.\r\n+OK \r\n"     # open() blocked for good before
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
