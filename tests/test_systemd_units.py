"""The systemd units in systemd/: the programs they run exist in a home made by
`qmailctl init`, their man pages exist, and `systemd-analyze verify` passes on
them as installed (/var/qmail replaced by a test home, man pages from a
non-editable pip install)."""
import os
import re
import shutil
import subprocess
import sys

import psutil
import pytest

from conftest import AS_ROOT, make_home, traversable_base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = os.path.join(ROOT, "systemd")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_install import fresh_install  # noqa: E402

DEFAULT_HOME = "/var/qmail"
EXEC = re.compile(r"^(Exec\w+)=[-@:+!]*(\S+)", re.M)


def units():
    return sorted(name for name in os.listdir(UNITS) if not name.startswith("."))


def text(name):
    with open(os.path.join(UNITS, name)) as f:
        return f.read()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, home): a fresh non-editable install and a home its qmailctl init made."""
    base = traversable_base(tmp_path_factory.mktemp("units"), prefix="qmailpy-units-")
    try:
        venv = fresh_install(base)
        home = os.path.join(base, "home")
        env = {"PATH": os.path.join(venv, "bin") + ":/usr/bin:/bin"}
        user = "nobody" if AS_ROOT else None
        done = subprocess.run([os.path.join(venv, "bin", "qmailctl"), "init", "--home", home, "--me",
                               "test.example"] + (["--user", user] if user else []),
                              env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        yield venv, home
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_units_run_the_programs_qmailctl_init_writes(tmp_path):
    home = make_home(traversable_base(tmp_path))
    checked = 0
    for name in units():
        for key, command in EXEC.findall(text(name)):
            if command.startswith(DEFAULT_HOME + "/"):
                path = home.path + command[len(DEFAULT_HOME):]
                assert os.access(path, os.X_OK), "%s %s: %s missing" % (name, key, path)
                checked += 1
            elif command.startswith("/"):
                assert os.access(command, os.X_OK), "%s %s: %s missing" % (name, key, command)
            else:
                raise AssertionError("%s %s: %s is not an absolute path" % (name, key, command))
    assert checked >= 4
    for name in ("qmail-send.service", "qmail-qmqpd.service", "qmail-smtpd@.service"):
        assert re.search(r"^ExecStart=%s/bin/qmail-" % DEFAULT_HOME, text(name), re.M), name


def test_every_documentation_line_names_a_page_in_man():
    for name in units():
        for page, section in re.findall(r"man:([\w.-]+)\((\d)\)", text(name)):
            assert os.path.exists(os.path.join(ROOT, "man", "%s.%s" % (page, section))), (name, page)


def test_queue_socket_units_come_before_smtp_and_delivery():
    local = text("qmail-qmqpd.socket")
    assert re.search(r"^ListenStream=%s/run/qmqp\.sock$" % DEFAULT_HOME, local, re.M)
    assert re.search(r"^SocketMode=0666$", local, re.M)
    assert re.search(r"^Before=.*\bqmail-smtpd\.socket\b", local, re.M)
    tcp = text("qmail-qmqpd-tcp.socket")
    assert re.search(r"^ListenStream=628$", tcp, re.M)
    assert re.search(r"^Service=qmail-qmqpd\.service$", tcp, re.M)
    assert re.search(r"^Before=.*\bqmail-smtpd\.socket\b", tcp, re.M)
    for name in ("qmail-smtpd@.service", "qmail-send.service", "qmail-smtpd.socket"):
        assert re.search(r"^After=.*\bqmail-qmqpd\.socket\b", text(name), re.M), name
    assert re.search(r"^Restart=always$", text("qmail-send.service"), re.M)


def test_the_smtp_socket_limits_connections_per_client_address():
    # as qmail-smtpd-listen's defaults: -c 40, -s half of it
    smtp = text("qmail-smtpd.socket")
    assert re.search(r"^Accept=yes$", smtp, re.M)     # the per-source limit needs Accept=yes
    assert unit_value("qmail-smtpd.socket", "MaxConnections") == "40"
    assert unit_value("qmail-smtpd.socket", "MaxConnectionsPerSource") == "20"


@pytest.mark.slow
def test_systemd_analyze_verify_is_clean(installed, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    venv, home = installed
    where = tmp_path / "units"
    where.mkdir()
    for name in units():
        unit = text(name).replace(DEFAULT_HOME, home)
        (where / name).write_text(unit)
    # man(1) finds the install's pages through PATH (venv/bin -> venv/share/man)
    env = {"PATH": os.path.join(venv, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(["systemd-analyze", "verify"] + [str(where / name) for name in units()],
                          env=env, capture_output=True, timeout=120)
    report = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0 and report.strip() == "", report


def unit_value(name, key):
    return re.search(r"^%s=(.+)$" % key, text(name), re.M).group(1).strip()


def test_qmqpd_socket_activation_queues_through_the_units_own_socket_and_program(tmp_path):
    """What systemd does with qmail-qmqpd.socket + .service, by systemd-socket-activate:
    the socket made outside, handed over as LISTEN_FDS to ExecStart (HOME/bin's launcher),
    which answers QMQP on it and queues the message."""
    if shutil.which("systemd-socket-activate") is None:
        pytest.skip("systemd-socket-activate is not installed (apt-get install systemd)")
    from qmailpy.queue.client import ServerSubmission
    home = make_home(traversable_base(tmp_path))
    listen = unit_value("qmail-qmqpd.socket", "ListenStream").replace(DEFAULT_HOME, home.path)
    program = unit_value("qmail-qmqpd.service", "ExecStart").replace(DEFAULT_HOME, home.path)
    assert listen == os.path.join(home.path, "run", "qmqp.sock")
    activator = subprocess.Popen(["systemd-socket-activate", "-l", listen, "-E", "QMAILHOME", program],
                                 env=dict(home.env), stderr=subprocess.PIPE)
    try:
        assert activator.stderr.readline().startswith(b"Listening on " + listen.encode())
        submission = ServerSubmission(home.path)
        submission.write(b"Subject: activated\n\nthrough the unit's socket\n")
        result = submission.finish(b"a@test.example", [b"b@test.example"])
        assert result.code == 0, result
        assert len(os.listdir(os.path.join(home.queue, "todo"))) == 1
        server = psutil.Process(activator.pid)
        assert server.cmdline()[1:3] == ["-IS", program]      # exec'd in place: same pid
    finally:
        activator.kill()
        activator.wait(timeout=30)
