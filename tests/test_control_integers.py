"""qmail's integer rule for numeric control files (docs/control-files.md "Control files").

qmail reads a number with control_readint: the first line, trailing blanks removed, then
scan_ulong - the leading decimal digits; a line with none (a sign, a leading space, an
empty file) or no file gives the program's default. Every numeric control file of every
qmailpy program goes through qmailpy.home.control_int (or readint, on bytes already
read); each file is checked here through the code its program reads it with, and each
daemon end to end by what the administrator sees.
"""
import os

import pytest

from qmailpy.home import INT_MAX, control_int, readint, scan_ulong
from qmqpd_harness import QmqpServer, ask, request
from smtpd_support import SmtpdProcess

CASES = ("-1", "  30", "30abc", "", None)        # None: no file


@pytest.mark.parametrize("line, number", [
    (b"30", 30), (b"30abc", 30), (b"0030 x", 30), (b"0", 0),
    (b"-1", None), (b"+5", None), (b"  30", None), (b"\t30", None), (b"", None), (b"abc", None),
    (b"99999999999999999999", INT_MAX), ("30\u0663", 30), ("\u0663", None),
])
def test_scan_ulong_takes_leading_ascii_digits_only(line, number):
    assert scan_ulong(line) == number


def test_control_int_reads_the_first_line_and_keeps_within_bounds(tmp_path):
    (tmp_path / "control").mkdir()
    home = str(tmp_path)
    for text, expected in ((b"30 \t\r\n7\n", 30), (b"\n30\n", 5), (b"-1\n", 5), (b"  30\n", 5),
                           (b"30abc", 30), (b"", 5), (b"500\n", 120), (b"0\n", 2)):
        (tmp_path / "control" / "n").write_bytes(text)
        assert control_int(home, "n", 5, low=2, high=120) == expected, text
    assert control_int(home, "absent", 5) == 5
    assert readint(None, 7) == 7 and readint(b"12x", 7) == 12 and readint("DATABYTES", 7) == 7


def _home(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "me").write_bytes(b"test.example\n")
    return str(tmp_path)


def _send(attr, channel=None):
    def read(home):
        from qmailpy.send.controls import SendControls
        value = getattr(SendControls(home), attr)
        return value[channel] if channel else value
    return read


def _smtpd(attr):
    def read(home):
        from qmailpy.smtpd.config import SmtpdConfig
        return getattr(SmtpdConfig(home, {}), attr)
    return read


def _remote(attr):
    def read(home):
        from qmailpy.remote.deliver import read_controls
        return getattr(read_controls(home), attr)
    return read


def _qmqpd(control):
    def read(home):
        from qmailpy.sizelimits import read_limit
        return read_limit(home, control)
    return read


def _maxrcpt(home):
    from qmailpy.queuelimits import read_maxrcpt
    return read_maxrcpt(home)


def _timeoutdns(home):
    from qmailpy import resolver
    return resolver.settings(home).timeout


def _metricsinterval(home):
    from qmailpy.send.metrics import MetricsFile
    return MetricsFile.of(home).interval


def _checkpassword(home):
    from qmailpy.smtpd.auth import checkpassword_timeout
    return checkpassword_timeout(home)


def _tls_handshake(home):
    from qmailpy.smtpd.tls import handshake_timeout
    return handshake_timeout(home)


def _logwriter(index):
    def read(home):
        from qmailpy.ctl.logwriter import limits
        return limits(home)[index]
    return read


def _segment_limit(home):
    from qmailpy.backends.log.commit import read_segment_limit
    return read_segment_limit(os.path.join(home, "control", "logsegmentsize"))


def _pop3requiretls(home):
    from qmailpy.pop3.popup import Popup
    return int(Popup(None, home, b"test.example", [], {"TCPREMOTEIP": "192.0.2.1"}).require_tls)


def _authcheck(attr):
    def read(home):
        from qmailpy.smtpd.authcheck import Settings
        return int(getattr(Settings(home), attr))
    return read


# (file, program's reader, default, what "30abc" gives: the 30 kept within the program's bounds)
FILES = [
    ("concurrencylocal", _send("concurrency", "local"), 10, 30),
    ("concurrencyremote", _send("concurrency", "remote"), 20, 30),
    ("queuelifetime", _send("lifetime"), 604800, 30),
    ("databytes", _smtpd("databytes"), 0, 30),
    ("timeoutsmtpd", _smtpd("timeout"), 1200, 30),
    ("timeoutsmtpdsession", _smtpd("session_deadline"), 3600, 30),
    ("timeoutsmtpddata", _smtpd("data_deadline"), 1200, 30),
    ("maxrcpt", _maxrcpt, 1000, 30),
    ("timeoutremote", _remote("timeout"), 1200, 30),
    ("timeoutconnect", _remote("timeoutconnect"), 60, 30),
    ("timeoutremotesession", _remote("session"), 3600, 30),
    ("timeoutdns", _timeoutdns, 30, 30),
    ("metricsinterval", _metricsinterval, 60, 30),
    ("timeoutcheckpassword", _checkpassword, 10, 30),
    ("timeoutsmtpdtls", _tls_handshake, 60, 30),
    ("logsize", _logwriter(0), 10485760, 4096),          # at least 4096
    ("logcount", _logwriter(1), 10, 30),
    ("logsegmentsize", _segment_limit, 64 * 1024 * 1024, 4096),     # at least 4096
]
QMQPD_FILES = [("databytes", _qmqpd("databytes"), 0, 30),
               ("localdatabytes", _qmqpd("localdatabytes"), 0, 30)]
# 0/1 files: "1abc" is 1, " 1" and "-1" the default 0
SWITCHES = [("pop3requiretls", _pop3requiretls), ("spfreject", _authcheck("spf_reject")),
            ("dmarcreject", _authcheck("dmarc_reject"))]


@pytest.mark.parametrize("text", CASES, ids=repr)
@pytest.mark.parametrize("name, read, default, thirty", FILES + QMQPD_FILES,
                         ids=[f[0] for f in FILES] + ["qmqpd-" + f[0] for f in QMQPD_FILES])
def test_each_numeric_file_keeps_qmails_rule(tmp_path, name, read, default, thirty, text):
    home = _home(tmp_path)
    if text is not None:
        (tmp_path / "control" / name).write_bytes(text.encode() + b"\n")
    assert read(home) == (thirty if text == "30abc" else default)


@pytest.mark.parametrize("text", ["-1", " 1", "1abc", "", None], ids=repr)
@pytest.mark.parametrize("name, read", SWITCHES, ids=[f[0] for f in SWITCHES])
def test_each_switch_file_keeps_qmails_rule(tmp_path, name, read, text):
    home = _home(tmp_path)
    if text is not None:
        (tmp_path / "control" / name).write_bytes(text.encode() + b"\n")
    assert read(home) == (1 if text == "1abc" else 0)


def test_concurrency_is_capped_at_what_a_spawner_runs(tmp_path):
    home = _home(tmp_path)
    (tmp_path / "control" / "concurrencyremote").write_bytes(b"500\n")
    (tmp_path / "control" / "concurrencylocal").write_bytes(b"0\n")
    assert _send("concurrency")(home) == {"local": 0, "remote": 120}


# -- end to end ---------------------------------------------------------------

def _showctl_files():
    from qmailpy.cli.qmail_showctl import QMAIL_FILES, qmailpy_files
    return [entry for entry in QMAIL_FILES + qmailpy_files() if entry[0] == "int"]


@pytest.mark.parametrize("text", CASES, ids=repr)
def test_showctl_shows_the_number_or_the_default(qmail_home, text):
    entries = _showctl_files()
    assert {e[1] for e in entries} >= {f[0] for f in FILES + QMQPD_FILES + SWITCHES} - {"metricsinterval"}
    for entry in entries:
        path = os.path.join(qmail_home.path, "control", entry[1])
        if text is None:
            if os.path.exists(path):
                os.unlink(path)
        else:
            qmail_home.control(entry[1], text + "\n")
    done = qmail_home.run(["qmail-showctl"])
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    for _, name, default, pre, post in entries:
        if text == "30abc":
            assert "\n%s: %s30%s.\n" % (name, pre, post) in out
        else:
            assert "\n%s: (Default.) %s%s%s.\n" % (name, pre, default, post) in out


@pytest.mark.parametrize("text, size", [("-1", b"250-SIZE\r\n"), ("  30", b"250-SIZE\r\n"),
                                        ("30abc", b"250-SIZE 30\r\n"), ("", b"250-SIZE\r\n")], ids=repr)
def test_smtpd_announces_the_databytes_it_keeps(qmail_home, text, size):
    qmail_home.control("databytes", text + "\n")
    smtpd = SmtpdProcess(qmail_home)
    try:
        assert smtpd.reply().startswith(b"220 ")
        ehlo = smtpd.command(b"EHLO client.example\r\n")
        assert size in ehlo, ehlo
        assert smtpd.command(b"QUIT\r\n").startswith(b"221 ")
    finally:
        smtpd.close()


@pytest.mark.parametrize("text, code", [("-1", 0), ("  1", 0), ("1abc", 12), ("", 0)], ids=repr)
def test_qmail_queue_caps_recipients_by_the_maxrcpt_it_reads(qmail_home, text, code):
    qmail_home.control("maxrcpt", text + "\n")
    done = qmail_home.queue_message(b"Subject: x\n\nbody\n", b"a@test.example",
                                    [b"b@test.example", b"c@test.example"])
    assert done.returncode == code, done.stderr


@pytest.mark.parametrize("local, remote, status", [
    ("-1", "  30", "local 0/10 remote 0/20"),
    ("30abc", "", "local 0/30 remote 0/20"),
    ("500", "-1", "local 0/120 remote 0/20"),
], ids=["minus-and-space", "digits-then-junk", "cap"])
def test_qmail_send_logs_the_concurrency_it_keeps(qmail_home, daemons, local, remote, status):
    qmail_home.control("concurrencylocal", local + "\n")
    qmail_home.control("concurrencyremote", remote + "\n")
    daemons.start()
    lines = daemons.wait_line(r"^status: ")
    assert [line for line in lines if line.startswith("status: ")][0] == "status: " + status


def test_qmail_qmqpd_bounds_tcp_requests_by_the_databytes_it_reads(qmail_home):
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    message = request(b"x" * 100, b"a@test.example", [b"b@test.example"])
    with QmqpServer(qmail_home, "-t", "10", "--tcp", "127.0.0.1:0") as server:
        for text, accepted in (("-1", True), ("  30", True), ("", True), ("30abc", False)):
            qmail_home.control("databytes", text + "\n")
            answer = ask(server.tcp, message)
            assert answer.startswith(b"Kok ") if accepted else answer.startswith(b"Dsorry, that message size"), \
                (text, answer)



@pytest.mark.parametrize("text", ["  1", "-1"], ids=repr)
def test_qmail_remote_keeps_the_default_session_deadline_for_lines_without_digits(qmail_home, text):
    """A greeting that takes about 2 s: past a 1-second deadline, well within the default 3600."""
    from remote_harness import ScriptedPeer, qmail_remote, route
    qmail_home.control("timeoutremotesession", text + "\n")
    ok = ("send", b"250 ok\r\n")
    script = [("drip", b"220 x\r\n", 0.3), ("line",), ok, ("line",), ok, ("line",), ok,
              ("line",), ("send", b"354 go\r\n"), ("data",), ("send", b"250 queued\r\n")]
    with ScriptedPeer(script) as peer:
        route(qmail_home, "x.test", peer.port)
        code, records = qmail_remote(qmail_home, "x.test", b"a@b.example", b"joe@x.test")
    assert code == 0 and records[0].startswith(b"r") and records[-1].startswith(b"K"), records
