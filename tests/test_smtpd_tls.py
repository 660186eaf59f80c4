"""STARTTLS, AUTH on the submission port and SMTPUTF8 in qmail-smtpd (issue 15), over real
TLS on 127.0.0.1 (listener) or a socket pair (qmail-smtpd as tcpserver runs it), with a
throw-away CA made by tls_certs.py."""
import os
import re
import shutil
import smtplib
import socket
import subprocess
import threading
import time

import psutil
import pytest

from delivery_support import wait_maildir
from queue_view import queued
from smtpd_support import TIMEOUT, ListenerProcess, SmtpdProcess
from smtpd_tls_support import TlsSession, certs, tls_home, tls_session  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

RECEIVED_TLS = re.compile(rb"  by \S+ with \(TLSv1\.[23]:[A-Z0-9_-]+ encrypted\) SMTP; ")


def submission_env(home):
    env = dict(home.env)
    env["SMTPAUTH"] = "!"
    return env


def ehlo_lines(reply):
    return [line[4:] for line in reply.split(b"\r\n")[:-1]]


# --- STARTTLS -------------------------------------------------------------------------------

def test_smtplib_starttls_through_the_listener_and_the_received_line(tls_home, certs):
    with ListenerProcess(tls_home) as listener:
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            code, text = client.ehlo("client.example")
            assert code == 250 and b"STARTTLS" in text.split(b"\n")
            client.starttls(context=certs.client_context())
            assert client.sock.version() in ("TLSv1.2", "TLSv1.3")
            code, text = client.ehlo("client.example")
            assert b"STARTTLS" not in text.split(b"\n")
            assert client.sendmail("a@far.example", ["me@test.example"],
                                   b"Subject: tls\r\n\r\nsecret\r\n") == {}
        assert listener.stop() == 0
    [msg] = queued(tls_home)
    lines = msg.mess.split(b"\n")
    assert lines[1] == b"Received: from unknown (HELO client.example) (127.0.0.1)"
    assert RECEIVED_TLS.match(lines[2]), lines[2]
    assert msg.body_after_received() == b"Subject: tls\n\nsecret\n"


def test_no_starttls_without_a_certificate_or_on_a_pipe(tls_home, certs):
    with SmtpdProcess(tls_home) as s:        # a socket pair: offered while the cert is there
        s.reply()
        assert b"STARTTLS" in ehlo_lines(s.command(b"EHLO c.example\r\n"))
    proc = subprocess.run(["qmail-smtpd"], input=b"EHLO c.example\r\nSTARTTLS\r\nQUIT\r\n",
                          capture_output=True, env=tls_home.env, timeout=TIMEOUT)
    assert b"STARTTLS" not in proc.stdout
    assert b"502 unimplemented (#5.5.1)\r\n221 " in proc.stdout
    os.unlink(certs_path(tls_home))
    with SmtpdProcess(tls_home) as s:
        s.reply()
        assert b"STARTTLS" not in ehlo_lines(s.command(b"EHLO c.example\r\n"))
        assert s.command(b"STARTTLS\r\n") == b"502 unimplemented (#5.5.1)\r\n"


def certs_path(home):
    return os.path.join(home.path, "control", "servercert.pem")


def test_an_unusable_certificate_is_answered_454(tls_home):
    tls_home.control("servercert.pem", "not a certificate\n")
    with SmtpdProcess(tls_home) as s:
        s.reply()
        assert s.command(b"STARTTLS\r\n") == (
            b"454 TLS not available due to temporary reason (#4.3.0)\r\n")
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"


def test_commands_pipelined_after_starttls_are_discarded(tls_home, certs):
    with ListenerProcess(tls_home) as listener:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT) as sock:
            f = sock.makefile("rb")
            assert f.readline() == b"220 test.example ESMTP\r\n"
            sock.sendall(b"STARTTLS\r\nRSET\r\n")           # one write: the injection
            assert f.readline() == b"220 ready for tls\r\n"
            tls = certs.client_context().wrap_socket(sock, server_hostname="localhost")
            tls.sendall(b"NOOP\r\n")
            assert tls.recv(100) == b"250 ok\r\n"        # not "250 flushed" for the RSET
            tls.sendall(b"QUIT\r\n")
            assert tls.recv(100) == b"221 test.example\r\n"


class InjectingProxy:
    """A man in the middle between a client and the listener, as in CVE-2011-0411: the
    client's STARTTLS line goes on in one segment with `injected` behind it; everything
    else, the TLS records too, passes unchanged both ways."""

    def __init__(self, port, injected):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.target, self.injected = port, injected
        self.done_injecting = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        import select
        client, _ = self.server.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target), timeout=TIMEOUT)
        seen = b""
        with client, upstream:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], TIMEOUT)
                if not ready:
                    return
                for sock in ready:
                    other = upstream if sock is client else client
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    if sock is client and not self.done_injecting:
                        seen += data
                        if seen.endswith(b"STARTTLS\r\n"):
                            data += self.injected
                            self.done_injecting = True
                    other.sendall(data)

    def close(self):
        self.server.close()
        self.thread.join(TIMEOUT)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl program is not installed")
def test_openssl_s_client_with_commands_injected_behind_starttls(tls_home, certs):
    """openssl s_client -starttls smtp through a proxy that appends `RSET` and a MAIL to the
    client's STARTTLS: none of them may run inside TLS, where they would pass for the client's
    own (a vulnerable server answers `250 flushed` and `250 ok` to the first commands of the
    TLS session); the listener then takes the next connection as usual."""
    with ListenerProcess(tls_home) as listener:
        proxy = InjectingProxy(listener.port, b"RSET\r\nMAIL FROM:<evil@injected.example>\r\n")
        try:
            done = subprocess.run(
                ["openssl", "s_client", "-starttls", "smtp", "-connect", "127.0.0.1:%d" % proxy.port,
                 "-CAfile", certs.ca, "-verify_return_error", "-crlf", "-quiet"],
                input=b"RCPT TO:<me@test.example>\nNOOP\nQUIT\n", capture_output=True,
                timeout=TIMEOUT)
        finally:
            proxy.close()
        assert proxy.done_injecting
        # in TLS, only the client's own three commands are answered, in order
        assert done.stdout == (b"503 MAIL first (#5.5.1)\r\n250 ok\r\n221 test.example\r\n"), (
            done.stdout + done.stderr)
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            assert client.noop() == (250, b"ok")
        assert listener.stop() == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl program is not installed")
def test_tls_below_1_2_is_refused(tls_home, certs):
    """A client limited to TLS 1.1 (its own security level lowered so that it tries) gets
    the protocol_version alert; TLS 1.2 is taken."""
    def s_client(*options):
        return subprocess.run(["openssl", "s_client", "-starttls", "smtp", "-connect",
                               "127.0.0.1:%d" % listener.port, "-CAfile", certs.ca, "-crlf",
                               "-ign_eof", *options],
                              input=b"QUIT\n", capture_output=True, timeout=TIMEOUT)
    with ListenerProcess(tls_home) as listener:
        old = s_client("-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0")
        assert b"alert protocol version" in old.stderr, old.stdout + old.stderr
        assert b"221 test.example" not in old.stdout
        new = s_client("-tls1_2")
        assert b"Protocol  : TLSv1.2" in new.stdout and b"221 test.example" in new.stdout, (
            new.stdout + new.stderr)
        assert listener.stop() == 0


def test_a_session_worker_presents_a_replaced_certificate(tls_home, certs):
    """A session worker keeps the TLS context it made while control/servercert.pem is
    unchanged (qmailpy/smtpd/tls.py); a certificate renamed into its place is presented from
    the next session on, by the same worker."""
    import ssl
    unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE

    def presented():
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            client.starttls(context=unverified)
            assert client.noop() == (250, b"ok")
            return client.sock.getpeercert(binary_form=True)

    def der(name):
        with open(os.path.join(certs.dir, name)) as f:
            return ssl.PEM_cert_to_DER_cert(f.read())

    with ListenerProcess(tls_home, "-c", "1") as listener:
        assert presented() == presented() == der("server.crt")
        [worker] = psutil.Process(listener.proc.pid).children()
        with open(certs_path(tls_home) + ".new", "wb") as out:
            for name in ("self.crt", "self.key"):
                with open(os.path.join(certs.dir, name), "rb") as f:
                    out.write(f.read())
        os.chmod(certs_path(tls_home) + ".new", 0o644)
        os.rename(certs_path(tls_home) + ".new", certs_path(tls_home))
        assert presented() == der("self.crt")
        assert psutil.Process(listener.proc.pid).children() == [worker]
        assert listener.stop() == 0


def test_starttls_resets_the_transaction_and_helo(tls_home, certs):
    s = TlsSession(tls_home)
    with s:
        s.reply()
        s.command(b"EHLO before.example\r\n")
        assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"250 ok\r\n"
        s.starttls(certs)
        assert s.command(b"RCPT TO:<me@test.example>\r\n") == b"503 MAIL first (#5.5.1)\r\n"
        assert s.command(b"STARTTLS\r\n") == b"502 unimplemented (#5.5.1)\r\n"
        assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<me@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"DATA\r\n") == b"354 go ahead\r\n"
        assert s.command(b"hi\r\n.\r\n").startswith(b"250 ok ")
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
    [msg] = queued(tls_home)
    # the HELO given before STARTTLS is forgotten
    assert msg.mess.split(b"\n")[1] == b"Received: from unknown (192.0.2.7)"


def test_garbage_or_no_handshake_ends_the_session_and_the_listener_keeps_serving(tls_home):
    with ListenerProcess(tls_home) as listener:
        garbage = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT)
        silent = socket.create_connection(("127.0.0.1", listener.port), timeout=TIMEOUT)
        for sock in (garbage, silent):
            f = sock.makefile("rb")
            assert f.readline() == b"220 test.example ESMTP\r\n"
            sock.sendall(b"STARTTLS\r\n")
            assert f.readline() == b"220 ready for tls\r\n"
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n")
        started = time.monotonic()
        assert closed(garbage)                       # no reply in clear, no TLS
        assert closed(silent)                        # timeoutsmtpdtls is 1 s
        assert time.monotonic() - started < 10
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            assert client.noop() == (250, b"ok")
        garbage.close()
        silent.close()
        assert listener.stop() == 0


def closed(sock):
    """True when the server closed the connection (a reset for unread bytes counts)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.skipif(shutil.which("swaks") is None, reason="swaks is not installed")
def test_swaks_tls(tls_home, certs):
    with ListenerProcess(tls_home) as listener:
        done = subprocess.run(["swaks", "-tls", "--server", "127.0.0.1", "--port", str(listener.port),
                               "--from", "a@far.example", "--to", "me@test.example",
                               "--helo", "swaks.example"],
                              capture_output=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr
        assert b"<-  220 ready for tls" in done.stdout
        assert b"~> QUIT" in done.stdout
        assert listener.stop() == 0
    [msg] = queued(tls_home)
    assert RECEIVED_TLS.match(msg.mess.split(b"\n")[2])


@pytest.mark.skipif(shutil.which("swaks") is None, reason="swaks is not installed")
@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN"])
def test_swaks_tls_auth_on_the_submission_port(tls_home, certs, mechanism):
    """swaks -tls -a relays through a SMTPAUTH=! listener; a wrong password is 535 and nothing
    is queued."""
    def swaks(password):
        return subprocess.run(["swaks", "-tls", "--server", "127.0.0.1", "--port", str(listener.port),
                               "--from", "alice@test.example", "--to", "bob@far.example",
                               "--helo", "swaks.example", "--auth", mechanism,
                               "--auth-user", "alice", "--auth-password", password],
                              capture_output=True, timeout=TIMEOUT)
    with ListenerProcess(tls_home, env=submission_env(tls_home)) as listener:
        wrong = swaks("guess")
        assert wrong.returncode != 0
        assert b"<~* 535 authentication failed (#5.7.8)" in wrong.stdout, wrong.stdout
        assert queued(tls_home) == []
        done = swaks("s3cret")
        assert done.returncode == 0, done.stdout + done.stderr
        assert b"<~  235 ok, go ahead (#2.0.0)" in done.stdout
        assert listener.stop() == 0
    [msg] = queued(tls_home)
    assert msg.recipients == [b"bob@far.example"]


# --- AUTH -----------------------------------------------------------------------------------

def test_submission_smtplib_login_grants_relaying(tls_home, certs):
    with ListenerProcess(tls_home, env=submission_env(tls_home)) as listener:
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            code, text = client.ehlo("client.example")
            assert not any(line.startswith(b"AUTH") for line in text.split(b"\n"))
            assert client.docmd("AUTH", "PLAIN AGFsaWNlAHMzY3JldA==") == (
                538, b"encryption required for requested authentication mechanism (#5.7.11)")
            assert client.docmd("MAIL", "FROM:<alice@test.example>") == (
                530, b"authentication required (#5.7.0)")
            client.starttls(context=certs.client_context())
            code, text = client.ehlo("client.example")
            assert b"AUTH LOGIN PLAIN" in text.split(b"\n")
            assert client.docmd("MAIL", "FROM:<alice@test.example>")[0] == 530
            assert client.login("alice", "s3cret") == (235, b"ok, go ahead (#2.0.0)")
            assert client.sendmail("alice@test.example", ["bob@far.example"],
                                   b"Subject: relayed\r\n\r\nout\r\n") == {}
        for method in ("LOGIN", "PLAIN"):      # each mechanism answering its 334 challenges
            with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
                client.starttls(context=certs.client_context())
                client.ehlo("client.example")
                client.user, client.password = "alice", "s3cret"
                assert client.auth(method, getattr(client, "auth_" + method.lower()),
                                   initial_response_ok=False)[0] == 235
        assert listener.stop() == 0
    [msg] = queued(tls_home)
    assert msg.recipients == [b"bob@far.example"]


def test_smtplib_login_against_qmail_smtpd_started_per_connection(tls_home, certs):
    """As tcpserver or systemd's Accept=yes run it: the program on an accepted TCP socket."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        procs = []

        def accept():
            conn, _ = server.accept()
            with conn:
                env = dict(tls_home.env, SMTPAUTH="!")
                env.pop("PROTO", None)          # derived from the socket (tcpenv.py)
                procs.append(subprocess.Popen(["qmail-smtpd"], stdin=conn, stdout=conn, env=env))

        thread = threading.Thread(target=accept)
        thread.start()
        with smtplib.SMTP("127.0.0.1", server.getsockname()[1], timeout=TIMEOUT) as client:
            thread.join()
            client.starttls(context=certs.client_context())
            assert client.login("alice", "s3cret")[0] == 235
            assert client.sendmail("alice@test.example", ["bob@far.example"],
                                   b"Subject: per connection\r\n\r\nout\r\n") == {}
        assert procs[0].wait(timeout=TIMEOUT) == 0
    [msg] = queued(tls_home)
    assert msg.recipients == [b"bob@far.example"]
    assert RECEIVED_TLS.match(msg.mess.split(b"\n")[2])


def test_qmail_smtpd_auth_login_plain_and_failures(tls_home, certs):
    with tls_session(tls_home, certs, SMTPAUTH="!") as s:
        assert s.command(b"AUTH CRAM-MD5\r\n") == b"504 unrecognized authentication type (#5.5.4)\r\n"
        assert s.command(b"AUTH PLAIN !!notbase64\r\n") == b"501 malformed auth input (#5.5.4)\r\n"
        assert s.command(b"AUTH LOGIN\r\n") == b"334 VXNlcm5hbWU6\r\n"
        assert s.command(b"*\r\n") == b"501 auth exchange cancelled (#5.0.0)\r\n"
        started = time.monotonic()
        assert s.command(b"AUTH LOGIN YWxpY2U=\r\n") == b"334 UGFzc3dvcmQ6\r\n"
        assert s.command(b"d3Jvbmc=\r\n") == b"535 authentication failed (#5.7.8)\r\n"
        assert time.monotonic() - started >= 1            # auth.FAIL_DELAY
        assert s.command(b"MAIL FROM:<alice@test.example>\r\n") == (
            b"530 authentication required (#5.7.0)\r\n")
        assert s.command(b"AUTH PLAIN\r\n") == b"334 \r\n"
        assert s.command(b"AGFsaWNlAHMzY3JldA==\r\n") == b"235 ok, go ahead (#2.0.0)\r\n"
        assert s.command(b"AUTH PLAIN AGFsaWNlAHMzY3JldA==\r\n") == (
            b"503 you're already authenticated (#5.5.0)\r\n")
        assert s.command(b"MAIL FROM:<alice@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<bob@far.example>\r\n") == b"250 ok\r\n"
        s.command(b"QUIT\r\n")
        assert s.close() == 0
    log = s.stderr.decode()
    assert "qmail-smtpd: auth failed: alice from 192.0.2.7\n" in log
    assert "qmail-smtpd: auth ok: alice from 192.0.2.7\n" in log


def test_futurerelease_is_offered_with_auth_and_taken_after_it(tls_home, certs):
    """RFC 4865 is a submission extension: a client that will AUTH sees FUTURERELEASE in the
    EHLO after STARTTLS, and its hold is taken once it has authenticated."""
    from queue_view import mtime_of
    with tls_session(tls_home, certs, SMTPAUTH="") as s:
        assert b"\r\n250-FUTURERELEASE 604800 " in s.command(b"EHLO c.example\r\n")
        assert s.command(b"MAIL FROM:<alice@test.example> HOLDFOR=600\r\n") == (
            b"550 sorry, only clients allowed to relay may hold mail (#5.7.1)\r\n")
        assert s.command(b"AUTH PLAIN AGFsaWNlAHMzY3JldA==\r\n") == b"235 ok, go ahead (#2.0.0)\r\n"
        before = int(time.time())       # HOLDFOR counts from the MAIL command
        assert s.command(b"MAIL FROM:<alice@test.example> HOLDFOR=600\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<bob@far.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"DATA\r\n") == b"354 go ahead\r\n"
        assert s.command(b"Subject: later\r\n\r\nheld\r\n.\r\n").startswith(b"250 ok ")
        s.command(b"QUIT\r\n")
    [msg] = queued(tls_home)
    assert before + 600 <= mtime_of(tls_home, msg) <= time.time() + 600


def test_too_many_failures_end_the_session(tls_home, certs):
    with tls_session(tls_home, certs, SMTPAUTH="") as s:
        started = time.monotonic()
        for _ in range(2):
            assert s.command(b"AUTH PLAIN AGFsaWNlAHdyb25n\r\n") == (
                b"535 authentication failed (#5.7.8)\r\n")
        s.send(b"AUTH PLAIN AGFsaWNlAHdyb25n\r\n")
        assert s.rest() == b"421 too many authentication failures (#4.7.0)\r\n"
        # the third guess waits as the others did: reconnecting at once saves nothing
        assert time.monotonic() - started >= 3
        assert s.close() == 1
    assert s.stderr.count(b"auth failed: alice") == 3


def test_a_hanging_checkpassword_is_killed_and_answered_454(tls_home, certs):
    with tls_session(tls_home, certs, SMTPAUTH="") as s:
        started = time.monotonic()
        assert s.command(b"AUTH PLAIN AGhhbmcAeA==\r\n") == (     # user "hang"
            b"454 temporary authentication failure (#4.7.0)\r\n")
        assert time.monotonic() - started < 10
        checkpw = os.path.join(tls_home.path, "checkpw")
        assert not [p for p in psutil.process_iter(["cmdline"]) if checkpw in (p.info["cmdline"] or [])]
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"
        # SMTPAUTH without "!": mail is taken without AUTH, but not relayed
        assert s.command(b"MAIL FROM:<a@b.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<bob@far.example>\r\n").startswith(b"553 ")


def test_a_hanging_checkpassword_that_left_its_process_group_is_still_killed(tls_home, certs):
    """killpg finds nobody (ESRCH; EPERM for a setuid program that made itself root):
    the session must not then wait for the program for as long as it runs."""
    with tls_session(tls_home, certs, SMTPAUTH="") as s:
        assert s.command(b"AUTH PLAIN AGxlYXZlAHg=\r\n") == (     # user "leave"
            b"454 temporary authentication failure (#4.7.0)\r\n")
        checkpw = os.path.join(tls_home.path, "checkpw")
        assert not [p for p in psutil.process_iter(["cmdline"]) if checkpw in (p.info["cmdline"] or [])]
        assert s.command(b"NOOP\r\n") == b"250 ok\r\n"


# --- SMTPUTF8 -------------------------------------------------------------------------------

@pytest.mark.both_backends
def test_smtputf8_to_a_utf8_local_part_lands_in_the_maildir(qmail_home, users, daemons):
    me = users.add("me-", dash="-", wildcard=True)      # me-EXT is ~me/.qmail-EXT
    users.dotqmail(me, "-jörg", "./Maildir/\n")
    daemons.start()
    daemons.wait_line(r"^status: ")
    with ListenerProcess(qmail_home) as listener:
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            code, text = client.ehlo("client.example")
            assert {b"SMTPUTF8", b"8BITMIME"} <= set(text.split(b"\n"))
            message = "Subject: grüße\r\n\r\nbody ü\r\n".encode()
            assert client.sendmail("rené@far.example", ["me-jörg@test.example"], message,
                                   mail_options=["SMTPUTF8", "BODY=8BITMIME"]) == {}
        assert listener.stop() == 0
    (got,) = wait_maildir(os.path.join(me, "Maildir"), 1)
    lines = got.split(b"\n")
    # qmail's quote(): a byte above 127 makes the local part a quoted string (RFC 6532 allows it)
    assert lines[0] == 'Return-Path: <"rené"@far.example>'.encode()
    assert lines[1] == "Delivered-To: me-jörg@test.example".encode()
    assert lines[4].startswith(b"  by test.example with UTF8SMTP; ")
    assert got.endswith("Subject: grüße\n\nbody ü\n".encode())


# --- qmailctl start --submission ------------------------------------------------------------

def test_qmailctl_start_submission(tls_home, certs):
    from ctl_support import ctl, free_port
    smtp, submission = free_port(), free_port()
    done = ctl(tls_home, "start", "--smtp", "127.0.0.1:%d" % smtp,
               "--submission", "127.0.0.1:%d" % submission)
    try:
        assert done.returncode == 0, done.stderr
        assert b"qmail-smtpd-listen started on 127.0.0.1:%d" % submission in done.stdout
        stat = ctl(tls_home, "stat").stdout.decode()
        assert len(re.findall(r"^qmail-smtpd-listen\s+pid \d+", stat, re.M)) == 2, stat
        with smtplib.SMTP("127.0.0.1", smtp, timeout=TIMEOUT) as client:
            client.starttls(context=certs.client_context())
            assert not any(line.startswith(b"AUTH") for line in client.ehlo()[1].split(b"\n"))
            assert client.docmd("MAIL", "FROM:<alice@test.example>") == (250, b"ok")
        with smtplib.SMTP("127.0.0.1", submission, timeout=TIMEOUT) as client:
            assert client.docmd("MAIL", "FROM:<alice@test.example>")[0] == 530
            client.starttls(context=certs.client_context())
            with pytest.raises(smtplib.SMTPAuthenticationError):
                client.login("alice", "guess")
            client.login("alice", "s3cret")
            assert client.docmd("MAIL", "FROM:<alice@test.example>") == (250, b"ok")
            assert client.docmd("RCPT", "TO:<bob@far.example>") == (250, b"ok")
            client.rset()
    finally:
        stop = ctl(tls_home, "stop")
    assert stop.returncode == 0, stop.stderr
    assert not os.path.exists(os.path.join(tls_home.path, "log", "qmail-submission.pid"))
    with open(os.path.join(tls_home.path, "log", "qmail-submission.log")) as f:
        log = f.read()
    # smtplib tries CRAM-MD5 (not offered), then PLAIN, then LOGIN: two failures, one success
    assert log.count("qmail-smtpd: auth failed: alice from 127.0.0.1\n") == 2, log
    assert log.count("qmail-smtpd: auth ok: alice from 127.0.0.1\n") == 1, log
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", submission), timeout=TIMEOUT).close()


# --- systemd/qmail-submission.socket ----------------------------------------------------------

@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate is not installed (apt-get install systemd)")
def test_the_submission_socket_unit_as_systemd_runs_it(tls_home, certs):
    """qmail-submission.socket (Accept=yes) and qmail-submission@.service (StandardInput=socket)
    as systemd-socket-activate --accept --inetd plays them: the unit's program and Environment=
    lines, one qmail-smtpd per connection; MAIL waits for STARTTLS and AUTH."""
    from ctl_support import free_port
    units = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "systemd")
    with open(os.path.join(units, "qmail-submission.socket")) as f:
        sock_unit = f.read()
    with open(os.path.join(units, "qmail-submission@.service")) as f:
        service = f.read()
    assert re.search(r"^ListenStream=587$", sock_unit, re.M)
    assert re.search(r"^Accept=yes$", sock_unit, re.M)
    assert re.search(r"^StandardInput=socket$", service, re.M)
    program = re.search(r"^ExecStart=(\S+)$", service, re.M).group(1).replace("/var/qmail", tls_home.path)
    settings = [e.replace("/var/qmail", tls_home.path)
                for e in re.findall(r"^Environment=(\S+)$", service, re.M)]
    assert sorted(settings) == ["QMAILHOME=" + tls_home.path, "SMTPAUTH=!"]
    port = free_port()
    env = {k: v for k, v in tls_home.env.items() if k not in ("QMAILHOME", "SMTPAUTH")}
    activator = subprocess.Popen(["systemd-socket-activate", "-l", "127.0.0.1:%d" % port, "--accept",
                                  "--inetd", *[a for e in settings for a in ("-E", e)], program],
                                 env=env, stderr=subprocess.PIPE)
    try:
        assert activator.stderr.readline().startswith(b"Listening on 127.0.0.1:%d" % port)
        with smtplib.SMTP("127.0.0.1", port, "client.example", timeout=TIMEOUT) as client:
            assert client.docmd("MAIL", "FROM:<alice@test.example>")[0] == 530
            client.starttls(context=certs.client_context())
            client.login("alice", "s3cret")
            assert client.sendmail("alice@test.example", ["bob@far.example"],
                                   b"Subject: unit\r\n\r\nthrough the unit\r\n") == {}
    finally:
        activator.kill()
        activator.wait(timeout=TIMEOUT)
        activator.stderr.close()
    [msg] = queued(tls_home)
    assert msg.recipients == [b"bob@far.example"]
    # the client's address from the socket (no tcpserver variables: qmailpy/smtpd/tcpenv.py)
    assert msg.mess.split(b"\n")[1] == b"Received: from unknown (HELO client.example) (127.0.0.1)"
    assert RECEIVED_TLS.match(msg.mess.split(b"\n")[2])
