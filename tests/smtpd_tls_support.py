"""Fixtures and helpers for the qmail-smtpd TLS and AUTH tests: a throw-away CA
(`certs`, made by tls_certs.py), a home with its server certificate and a
checkpassword program (`tls_home`: alice's password is s3cret; user hang hangs and
user leave leaves qmail-smtpd's process group), and a qmail-smtpd session on a socket
pair already in TLS (tls_session).
"""
import os
import sys

import pytest

from smtpd_support import SmtpdProcess
from tls_certs import make_certs

CHECKPASSWORD = """#!%s -S
import os, sys, time
user, password = os.read(3, 512).split(b"\\0")[:2]
if user == b"hang":
    time.sleep(600)
if user == b"leave":                    # out of the process group qmail-smtpd kills
    os.setpgid(0, os.getpgid(os.getppid()))
    time.sleep(600)
sys.exit(0 if (user, password) == (b"alice", b"s3cret") else 1)
""" % sys.executable


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture
def tls_home(qmail_home, certs):
    qmail_home.control("servercert.pem", certs.server_bytes())
    qmail_home.control("timeoutsmtpdtls", "1\n")
    qmail_home.control("timeoutcheckpassword", "1\n")
    qmail_home.control("rcpthosts", "test.example\n")
    path = os.path.join(qmail_home.path, "checkpw")
    with open(path, "w") as f:
        f.write(CHECKPASSWORD)
    os.chmod(path, 0o755)
    qmail_home.control("checkpassword", path + "\n")
    return qmail_home


class TlsSession(SmtpdProcess):
    """qmail-smtpd on a socket pair; starttls() moves the client side into TLS."""

    def starttls(self, certs):
        assert self.command(b"STARTTLS\r\n") == b"220 ready for tls\r\n"
        assert self.pending == b""
        self.client = certs.client_context().wrap_socket(self.client, server_hostname="localhost")


def tls_session(home, certs, **env):
    s = TlsSession(home, **env)
    assert s.reply() == b"220 test.example ESMTP\r\n"
    s.command(b"EHLO c.example\r\n")
    s.starttls(certs)
    return s
