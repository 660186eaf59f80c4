"""predate, datemail, mailsubj and tcp-env as processes (qmail's predate.c, datemail, mailsubj, tcp-env.c)."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow

DATE = re.compile(rb"Date: (\d{1,2}) (\w{3}) (\d{4}) (\d\d):(\d\d):(\d\d) ([+-]\d{4})\n")


@pytest.mark.parametrize("tz, offset", [("UTC0", b"+0000"), ("IST-5:30", b"+0530"), ("EST5", b"-0500")])
def test_predate_puts_a_local_date_before_the_message(qmail_home, tz, offset):
    before = time.time()
    done = qmail_home.run(["predate", "cat"], input=b"Subject: x\n\nbody", env=dict(qmail_home.env, TZ=tz))
    assert done.returncode == 0 and done.stderr == b""
    m = DATE.match(done.stdout)
    assert m and m.group(7) == offset, done.stdout
    assert done.stdout[m.end():] == b"Subject: x\n\nbody"
    shift = (int(offset[1:3]) * 60 + int(offset[3:])) * 60 * (1 if offset[:1] == b"+" else -1)
    stamp = time.strptime(b" ".join(m.groups()[:3]).decode() + " " + b":".join(m.groups()[3:6]).decode(),
                          "%d %b %Y %H:%M:%S")
    import calendar
    utc = calendar.timegm(stamp) - shift
    assert before - 2 <= utc <= time.time() + 2


def test_predate_passes_on_the_childs_exit_code_and_reports_failures(qmail_home):
    h = qmail_home
    assert h.run(["predate", "sh", "-c", "cat >/dev/null; exit 7"], input=b"x\n").returncode == 7
    done = h.run(["predate", "sh", "-c", "kill -9 $$"], input=b"x\n")
    assert (done.returncode, done.stderr) == (111, b"predate: fatal: child crashed\n")
    done = h.run(["predate", "/nonexistent/program"], input=b"x\n")
    assert (done.returncode, done.stderr) == (
        111, b"predate: fatal: unable to run /nonexistent/program: file does not exist\n")
    done = h.run(["predate"])
    assert (done.returncode, done.stderr) == (100, b"predate: usage: predate child\n")


@pytest.fixture
def captured(qmail_home):
    """QMAILQUEUE set to a script that keeps the message and the envelope; returns (env, read)."""
    d = os.path.join(qmail_home.path, "captured")
    os.mkdir(d)
    script = os.path.join(d, "qq")
    with open(script, "w") as f:
        f.write("#!/bin/sh\ncat > %s/msg\ncat <&1 > %s/env\n" % (d, d))
    os.chmod(script, 0o755)

    def read():
        with open(os.path.join(d, "msg"), "rb") as m, open(os.path.join(d, "env"), "rb") as e:
            return m.read(), e.read()
    return dict(qmail_home.env, QMAILQUEUE=script), read


def test_datemail_is_sendmail_with_a_local_date(qmail_home, captured):
    env, read = captured
    done = qmail_home.run(["datemail", "-t"], input=b"To: joe@test.example\nSubject: d\n\nbody\n",
                          env=dict(env, TZ="IST-5:30"))
    assert (done.returncode, done.stderr) == (0, b"")
    msg, envelope = read()
    dates = [line for line in msg.split(b"\n\n")[0].split(b"\n") if line.startswith(b"Date:")]
    assert len(dates) == 1 and DATE.match(dates[0] + b"\n").group(7) == b"+0530"
    assert b"Tjoe@test.example\0" in envelope


def test_mailsubj_sends_stdin_with_subject_and_to(qmail_home, captured):
    env, read = captured
    done = qmail_home.run(["mailsubj", "hi there", "a@test.example", "b@test.example"], input=b"text\n", env=env)
    assert (done.returncode, done.stderr) == (0, b"")
    msg, envelope = read()
    head, body = msg.split(b"\n\n", 1)
    assert b"\nSubject: hi there\n" in b"\n" + head + b"\n"
    assert b"\nTo: a@test.example, b@test.example\n" in b"\n" + head + b"\n"
    assert body == b"text\n"
    assert envelope.endswith(b"Ta@test.example\0Tb@test.example\0\0")
    done = qmail_home.run(["mailsubj", "only a subject"], input=b"", env=env)
    assert (done.returncode, done.stderr) == (100, b"mailsubj: usage: mailsubj subject recipient ...\n")


def _closed_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tcp_env_sets_the_connections_variables(qmail_home):
    h = qmail_home
    h.control("dnsresolvers", "127.0.0.1:%d\n" % _closed_udp_port())     # no names: lookups fail fast
    h.control("timeoutdns", "1\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()
        with client, conn:
            env = dict(h.env, TCPREMOTEHOST="stale.example", PROTO="SOMETHING")
            done = subprocess.run(["tcp-env", "-R", "env"], stdin=conn, capture_output=True, env=env, timeout=60)
            assert done.returncode == 0, done.stderr
            got = dict(line.split("=", 1) for line in done.stdout.decode().splitlines() if "=" in line)
            assert {k: got.get(k) for k in ("PROTO", "TCPREMOTEIP", "TCPREMOTEPORT", "TCPLOCALIP", "TCPLOCALPORT",
                                            "TCPREMOTEHOST", "TCPREMOTEINFO")} == {
                "PROTO": "TCP", "TCPREMOTEIP": "127.0.0.1", "TCPREMOTEPORT": str(client.getsockname()[1]),
                "TCPLOCALIP": "127.0.0.1", "TCPLOCALPORT": str(listener.getsockname()[1]),
                "TCPREMOTEHOST": None, "TCPREMOTEINFO": None}
            done = subprocess.run(["tcp-env", "env"], stdin=conn, capture_output=True, timeout=60,
                                  env=dict(h.env, PROTO="TCP", TCPREMOTEIP="192.0.2.1"))
            assert b"\nTCPREMOTEIP=192.0.2.1\n" in b"\n" + done.stdout   # PROTO=TCP: already set
            # the program starts with SIGPIPE and SIGXFSZ at their defaults (qmail's sig_pipedefault)
            done = subprocess.run(["tcp-env", "-R", "grep", "^SigIgn:", "/proc/self/status"], stdin=conn,
                                  capture_output=True, env=env, timeout=60)
            ignored = int(done.stdout.split()[1], 16)
            assert ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)) == 0, done.stdout


def test_tcp_env_bad_input(qmail_home):
    h = qmail_home
    env = dict(h.env)
    env.pop("PROTO", None)
    done = h.run(["tcp-env", "env"], input=b"", env=env)
    assert (done.returncode, done.stderr) == (111, b"tcp-env: fatal: standard input is not a socket\n")
    done = h.run(["tcp-env", "-R"], env=env)
    assert (done.returncode, done.stderr) == (100, b"tcp-env: usage: tcp-env [ -rR ] [ -t timeout ] program\n")


def test_qreceipt_sends_qmails_notice_when_asked(qmail_home, captured):
    env, read = captured
    message = (b"Message-ID: <1.2@x.example>\nNotice-Requested-Upon-Delivery-To: Joe <joe@test.example>,\n"
               b" other@test.example\nSubject: hi\n\nbody\n")
    done = qmail_home.run(["qreceipt", "joe@test.example"], input=message, env=dict(env, SENDER="bob@x.example"))
    assert (done.returncode, done.stderr) == (0, b"")
    msg, envelope = read()
    assert msg == (b"From: DELIVERY NOTICE SYSTEM <bob@x.example>\nTo: <bob@x.example>\n"
                   b"Subject: success notice\n\n"
                   b"Hi! This is the qreceipt program. Your message was delivered to the\n"
                   b"following address: joe@test.example. Thanks for asking.\n"
                   b"Your Message-ID: <1.2@x.example>\n")
    assert envelope == b"F\0Tbob@x.example\0\0"


def test_qreceipt_sends_nothing_unless_asked_and_refuses_bad_input(qmail_home, captured):
    env, read = captured
    asked = b"Notice-Requested-Upon-Delivery-To: joe@test.example\n\nbody\n"
    for message, sender, target in ((b"Subject: x\n\nbody\n", "bob@x.example", "joe@test.example"),
                                    (asked, "bob@x.example", "JOE@test.example"),
                                    (asked, "", "joe@test.example"), (asked, "#@[]", "joe@test.example")):
        done = qmail_home.run(["qreceipt", target], input=message, env=dict(env, SENDER=sender))
        assert (done.returncode, done.stderr) == (0, b"")
    assert not os.path.exists(os.path.join(qmail_home.path, "captured", "msg"))
    done = qmail_home.run(["qreceipt", "joe@test.example"], env=dict(env, SENDER="bob@x.example"),
                          input=b"Notice-Requested-Upon-Delivery-To: <joe@test.example\n\n")
    assert (done.returncode, done.stderr) == (
        100, b"qreceipt: fatal: unable to parse this: Notice-Requested-Upon-Delivery-To: <joe@test.example\n")
    env.pop("SENDER", None)
    done = qmail_home.run(["qreceipt", "joe@test.example"], input=asked, env=env)
    assert (done.returncode, done.stderr) == (100, b"qreceipt: usage: qreceipt deliveryaddress\n")


def _syslog_run(tmp_path, argv, data):
    """Run argv in a private mount namespace whose /dev/log is a datagram socket of ours; the
    datagrams it sent there."""
    import shutil
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    path = os.path.join(str(tmp_path), "log.sock")
    if os.path.exists(path):
        os.unlink(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        os.chmod(path, 0o666)
        script = ('mount -t tmpfs none /dev && : > /dev/log && mount --bind "$0" /dev/log && exec "$@"')
        done = subprocess.run(["unshare", "-rm", "sh", "-c", script, path] + argv, input=data,
                              capture_output=True, timeout=60)
        if done.returncode != 0 and b"unshare" in done.stderr:
            pytest.skip("no user namespaces here: %s" % done.stderr.decode(errors="replace"))
        assert done.returncode == 0, done.stderr
        server.setblocking(False)
        got = []
        while True:
            try:
                got.append(server.recv(65536))
            except BlockingIOError:
                return got


SYSLOG = re.compile(rb"<(\d+)>\w{3} [ \d]\d \d\d:\d\d:\d\d ([^:]+): (\d+\.\d{6})([ +])(.*)$", re.S)


def test_splogger_sends_each_line_to_syslog_as_qmails(qmail_home, tmp_path):
    from conftest import VENV_BIN
    splogger = os.path.join(VENV_BIN, "splogger")
    long_line = b"x" * 1000
    got = _syslog_run(tmp_path, [splogger, "qmail", "3"],
                      b"new msg 1\nalert: oh no\n\nwarning: bad\x01byte\n" + long_line + b"\nlast")
    parsed = [SYSLOG.match(d) for d in got]
    assert all(parsed), got
    rows = [(int(m.group(1)), m.group(2), m.group(4), m.group(5)) for m in parsed]
    daemon = 3 << 3
    assert rows == [(daemon | 6, b"qmail", b" ", b"new msg 1"), (daemon | 1, b"qmail", b" ", b"alert: oh no"),
                    (daemon | 4, b"qmail", b" ", b"warning: bad?byte"),
                    (daemon | 6, b"qmail", b" ", b"x" * 799), (daemon | 6, b"qmail", b"+", b"x" * 201),
                    (daemon | 6, b"qmail", b" ", b"last")]
    assert parsed[3].group(3) == parsed[4].group(3)             # a piece keeps its line's stamp
    assert abs(float(parsed[0].group(3)) - time.time()) < 60
    got = _syslog_run(tmp_path, [splogger], b"hello\n")
    assert [SYSLOG.match(d).group(1, 2) for d in got] == [(b"%d" % (2 << 3 | 6), b"splogger")]


def _utmp_record(kind, line, user):
    import struct
    return struct.pack("=hxxi32s4s32s256s52x", kind, 1, line, b"", user, b"")


def test_qbiff_writes_qmails_notice_to_the_users_biff_y_terminals(qmail_home, tmp_path):
    import shutil
    from conftest import VENV_BIN
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    dev, run = tmp_path / "dev", tmp_path / "run"
    (dev / "pts").mkdir(parents=True)
    run.mkdir()
    for name, mode in (("pts/5", 0o700), ("tty2", 0o600), ("pts/6", 0o700), ("pts/7", 0o700)):
        (dev / name).write_bytes(b"")
        os.chmod(dev / name, mode)
    (run / "utmp").write_bytes(_utmp_record(7, b"pts/5", b"joe") + _utmp_record(7, b"tty2", b"joe")
                               + _utmp_record(7, b"pts/6", b"ann") + _utmp_record(8, b"pts/7", b"joe")
                               + _utmp_record(7, b"../pts/5", b"joe"))
    script = 'd=$0; r=$1; shift; mount --bind "$d" /dev && mount --bind "$r" /run && exec "$@"'
    message = (b"Subject: hello\tthere\nX: y\n\nfirst line\n"
               b"second line of a longer body that goes on and on and on\n")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(dev), str(run), os.path.join(VENV_BIN, "qbiff")],
                          input=message, capture_output=True, timeout=60,
                          env=dict(qmail_home.env, USER="joe", SENDER="bob@x.example", LOCAL="joe-list"))
    if done.returncode != 0 and b"unshare" in done.stderr:
        pytest.skip("no user namespaces here: %s" % done.stderr.decode(errors="replace"))
    assert (done.returncode, done.stderr) == (0, b"")
    text = b"    hello/there/first line/second line of a longer body that goes on and on an"
    assert len(text) == 78
    assert (dev / "pts/5").read_bytes() == b"\r\n\a*** TO <joe-list> FROM <bob@x.example>\r\n" + text + b"\r\n"
    assert [(dev / n).read_bytes() for n in ("tty2", "pts/6", "pts/7")] == [b"", b"", b""]
    env = dict(qmail_home.env, SENDER="bob@x.example", LOCAL="joe")
    env.pop("USER", None)
    done = qmail_home.run(["qbiff"], input=message, env=env)     # no USER: nothing to do, never a failure
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


def test_tcp_env_asks_the_clients_ident_service(monkeypatch):
    """The RFC 1413 exchange itself, against an ident server on a free port (113 needs root)."""
    import threading
    from qmailpy.cli import tcp_env
    asked = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        monkeypatch.setattr(tcp_env, "IDENT_PORT", server.getsockname()[1])

        def answer(replies):
            for reply in replies:
                conn, _ = server.accept()
                with conn:
                    asked.append(conn.recv(100))
                    conn.sendall(reply)
        t = threading.Thread(target=answer, args=([b"6193, 23 : USERID : UNIX : stjohns\r\n",
                                                   b"6195, 23 : ERROR : NO-USER\r\n"],))
        t.start()
        assert tcp_env.ident(("127.0.0.1", 23), ("127.0.0.1", 6193), 5) == "stjohns"
        assert tcp_env.ident(("127.0.0.1", 23), ("127.0.0.1", 6195), 5) is None
        t.join(10)
    assert asked == [b"6193 , 23\r\n", b"6195 , 23\r\n"]
