"""Real milters in front of qmail-smtpd (docs/milter.md): rspamd from Debian through its
milter proxy (GTUBE refused, a clean message annotated with its X-Spamd/X-Rspamd headers)
and OpenDKIM in signing mode (a DKIM-Signature added that verifies). Skipped only where
the program is not installed or does not start.
"""
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from queue_view import queued
from rspamd_harness import Rspamd, Unavailable
from smtpd_support import GREETING, SmtpdProcess

pytestmark = pytest.mark.slow

GTUBE = b"XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X"
CLEAN = (b"From: Alice <alice@test.example>\r\nTo: bob@test.example\r\nSubject: lunch\r\n"
         b"Date: Fri, 27 Nov 2026 03:00:00 +0000\r\nMessage-ID: <lunch.1@test.example>\r\n\r\n"
         b"Shall we meet at noon?\r\n")


def send(home, message, **env):
    with SmtpdProcess(home, **env) as s:
        assert s.reply() == GREETING
        assert s.command(b"HELO client.example\r\n").startswith(b"250 ")
        mail = s.command(b"MAIL FROM:<alice@test.example>\r\n")
        if mail != b"250 ok\r\n":
            s.close()
            pytest.fail("MAIL: %r %r" % (mail, s.stderr))
        assert s.command(b"RCPT TO:<bob@test.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"DATA\r\n") == b"354 go ahead\r\n"
        reply = s.command(message + b".\r\n")
        assert s.command(b"QUIT\r\n") == b"221 test.example\r\n"
        assert s.close() == 0
    return reply, s.stderr


@pytest.fixture(scope="module")
def rspamd():
    directory = tempfile.mkdtemp(prefix="qmailpy-rspamd-")
    try:
        server = Rspamd(directory)
    except Unavailable as e:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(str(e))
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def test_rspamd_refuses_gtube_and_annotates_a_clean_message(qmail_home, rspamd):
    qmail_home.control("milters", "inet:127.0.0.1:%d\n" % rspamd.port)
    reply, _ = send(qmail_home, CLEAN.replace(b"noon?", b"noon?\r\n" + GTUBE))
    assert reply == b"554 5.7.1 Gtube pattern\r\n"
    assert queued(qmail_home) == []
    reply, _ = send(qmail_home, CLEAN)
    assert reply.startswith(b"250 ok ")
    [m] = queued(qmail_home)
    head, _, body = m.mess.partition(b"\n\n")
    assert b"\nX-Spamd-Result: default: False [" in head and b"\nX-Rspamd-Server: " in head
    assert b"\nX-Rspamd-Queue-Id: " in head
    assert body == b"Shall we meet at noon?\n" and m.recipients == [b"bob@test.example"]


def test_opendkim_signs(qmail_home, tmp_path):
    opendkim = shutil.which("opendkim") or shutil.which("opendkim", path="/usr/sbin")
    genkey = shutil.which("opendkim-genkey") or shutil.which("opendkim-genkey", path="/usr/sbin")
    if opendkim is None or genkey is None:
        pytest.skip("opendkim and opendkim-tools are not installed (bin/test installs them)")
    keys = tempfile.mkdtemp(prefix="qmailpy-opendkim-")
    try:
        subprocess.run([genkey, "-b", "2048", "-d", "test.example", "-s", "sel", "-D", keys],
                       check=True, timeout=60)
        sock = os.path.join(keys, "opendkim.sock")
        conf = os.path.join(keys, "opendkim.conf")
        with open(conf, "w") as f:
            f.write("Mode s\nDomain test.example\nSelector sel\nKeyFile %s/sel.private\n"
                    "Socket local:%s\nInternalHosts 127.0.0.1\nCanonicalization relaxed/relaxed\n"
                    "Background no\nSyslog no\nUMask 000\nPidFile %s/pid\nRequireSafeKeys false\n" % (keys, sock, keys))
            if os.geteuid() == 0:
                f.write("UserID opendkim\n")
                account = pwd.getpwnam("opendkim")
                for name in os.listdir(keys) + ["."]:
                    os.chown(os.path.join(keys, name), account.pw_uid, account.pw_gid)
                os.chmod(keys, 0o755)
        proc = subprocess.Popen([opendkim, "-f", "-x", conf], stderr=subprocess.PIPE)
        try:
            _wait_for_socket(proc, sock)
            qmail_home.control("milters", "unix:%s\n" % sock)
            reply, stderr = send(qmail_home, CLEAN, TCPREMOTEIP="127.0.0.1")
            assert reply.startswith(b"250 ok "), stderr
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        [m] = queued(qmail_home)
        assert b"\nDKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=test.example;" \
            in m.mess
        with open(os.path.join(keys, "sel.txt")) as f:
            record = "".join(part.split('"')[1] for part in f.read().split("\n") if '"' in part)
        import dkim
        message = m.mess.split(b"\n", 1)[1]            # without qmail-queue's own Received
        assert dkim.verify(message.replace(b"\n", b"\r\n"),
                           dnsfunc=lambda name, timeout=5: record.encode())
    finally:
        shutil.rmtree(keys, ignore_errors=True)


def _wait_for_socket(proc, path):
    """opendkim is ready when its socket accepts: woken by inotify when a name appears in the
    socket's directory, and at least every second to see whether opendkim exited."""
    import socket
    import time
    from inotify_simple import INotify, flags
    with INotify() as watch:
        watch.add_watch(os.path.dirname(path), flags.CREATE | flags.MOVED_TO)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("opendkim exited: %s" % proc.stderr.read().decode(errors="replace"))
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                return
            except OSError:
                watch.read(timeout=1000)
    pytest.fail("opendkim did not open %s" % path)
