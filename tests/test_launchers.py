"""QMAILHOME/bin from a real, non-editable `pip install` (qmailctl(8) "init"):
launchers that start Python without site, from which a message is queued and
the daemons run."""
import os
import pwd
import re
import shutil
import subprocess
import sys

import psutil
import pytest

from conftest import AS_ROOT, traversable_base

# The venv fixture installs the package into a fresh virtualenv (6-9 s)
pytestmark = pytest.mark.slow

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from fresh_install import fresh_install, site_packages  # noqa: E402

USER = "nobody" if AS_ROOT else pwd.getpwuid(os.geteuid()).pw_name
PER_MESSAGE = ("qmail-queue", "qmail-local", "qmail-remote", "qmail-smtpd", "sendmail", "qmail-inject")
DAEMONS = ("qmail-start", "qmail-send", "qmail-lspawn", "qmail-rspawn", "qmail-clean",
           "qmail-smtpd-listen", "qmail-qmqpd")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    base = traversable_base(tmp_path_factory.mktemp("fresh"), prefix="qmailpy-fresh-")
    try:
        yield fresh_install(base)
    finally:
        if AS_ROOT:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def home(venv, tmp_path):
    base = traversable_base(tmp_path)
    path = os.path.join(base, "home")
    # PATH without the test venv: only the fresh install's programs can be found
    env = {"PATH": os.path.join(venv, "bin") + ":/usr/bin:/bin", "QMAILHOME": path}
    done = subprocess.run([os.path.join(venv, "bin", "qmailctl"), "init", "--home", path,
                           "--me", "test.example", "--user", USER], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert re.search(rb"\d+ programs in %s/bin" % path.encode(), done.stdout), done.stdout
    yield path, env
    subprocess.run([os.path.join(path, "bin", "qmailctl"), "stop", "--timeout", "30"], env=env,
                   capture_output=True, timeout=60)
    if AS_ROOT:
        shutil.rmtree(base, ignore_errors=True)


def shebang(path):
    with open(path) as f:
        return f.readline()


def test_every_program_is_a_launcher_of_the_installing_python(venv, home):
    path, env = home
    names = set(os.listdir(os.path.join(path, "bin")))
    assert set(PER_MESSAGE + DAEMONS) <= names
    for name in names:
        program = os.path.join(path, "bin", name)
        assert os.stat(program).st_mode & 0o777 == 0o755
        python = os.path.join(venv, "bin", "python")
        # qmail-audit runs Spark, whose workers start Python their own way: with site
        assert shebang(program) == ("#!%s\n" % python if name == "qmail-audit" else "#!%s -IS\n" % python)


def test_home_bin_qmailctl_finds_the_installed_layout(venv, home):
    """python -IS in a virtualenv has sys.prefix /usr: layout.conf is found through the
    distribution's file list, in the venv's share/qmailpy (not the checkout's)."""
    path, env = home
    done = subprocess.run([os.path.join(path, "bin", "qmailctl"), "check", "--home", path], env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    probe = subprocess.run([os.path.join(venv, "bin", "python"), "-IS", "-c",
                            "import sys; sys.path.extend(%r); from qmailpy import hierarchy; print(hierarchy.layout_file())"
                            % ([site_packages(venv)],)], capture_output=True, timeout=60, cwd="/")
    assert probe.stdout.decode().strip() == os.path.join(venv, "share", "qmailpy", "queue-layout", "layout.conf"), \
        probe.stderr.decode()


def test_man_finds_the_pages_with_home_bin_on_path(venv, home):
    """HOME/man is a link to the installation's pages: man(1) looks in HOME/bin/../man."""
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    path, env = home
    assert os.readlink(os.path.join(path, "man")) == os.path.join(venv, "share", "man")
    env = dict(os.environ, PATH=os.path.join(path, "bin") + ":/usr/bin:/bin")
    env.pop("MANPATH", None)
    done = subprocess.run(["man", "-w", "8", "qmail-send"], env=env, capture_output=True, timeout=60)
    assert done.stdout.decode().strip() == os.path.join(path, "man", "man8", "qmail-send.8"), done.stderr
    for section, page in (("7", "qmail"), ("5", "qmail-control"), ("1", "maildir2mbox")):  # qmail's manual
        done = subprocess.run(["man", "-w", section, page], env=env, capture_output=True, timeout=60)
        assert done.stdout.decode().strip() == os.path.join(path, "man", "man" + section, page + "." + section)


def test_a_launcher_starts_without_site_and_imports_the_installed_package(venv, home):
    """Run as the kernel runs it (its #! line), with -v: the import trail shows no
    site and qmailpy's code read from the fresh venv's site-packages."""
    path, env = home
    program = os.path.join(path, "bin", "qmail-queue")
    interpreter, flags = shebang(program)[2:].split()
    done = subprocess.run([interpreter, "-v", flags, program], input=b"", env=env,
                          capture_output=True, timeout=60)
    trail = done.stderr.decode(errors="replace")
    imported = re.findall(r"^import '([\w.]+)'", trail, re.M)
    assert "qmailpy.cli.qmail_queue" in imported, trail[-2000:]
    assert "site" not in imported and "sitecustomize" not in imported
    sources = re.findall(r"^# code object from '([^']*/qmail_queue\.[^']*)'$", trail, re.M)
    assert sources and all(s.startswith(site_packages(venv) + "/") for s in sources), sources


def test_a_message_queued_through_home_bin_qmail_queue_lands_in_the_queue(home):
    path, env = home
    message = b"Subject: launched\n\nfrom QMAILHOME/bin/qmail-queue\n"
    env_r, env_w = os.pipe()
    os.write(env_w, b"Fa@test.example\0Tb@test.example\0\0")
    os.close(env_w)
    done = subprocess.run([os.path.join(path, "bin", "qmail-queue")], input=message, stdout=env_r,
                          env=env, stderr=subprocess.PIPE, timeout=60)
    os.close(env_r)
    assert done.returncode == 0, done.stderr
    queued = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(path, "queue", "mess")) for f in files]
    assert len(queued) == 1
    with open(queued[0], "rb") as f:
        assert f.read().endswith(message)
    assert len(os.listdir(os.path.join(path, "queue", "todo"))) == 1


def test_the_daemons_run_from_home_bin(home, venv):
    """qmailctl start: every daemon, and qmail-start's children, are HOME/bin's launchers;
    as root in a single-user home (bin/ is its user's, who could rewrite a launcher), the
    installation's own programs."""
    path, env = home
    done = subprocess.run([os.path.join(path, "bin", "qmailctl"), "start"], env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    pids = []
    for name in ("qmail-send.pid", "qmail-qmqpd.pid"):
        with open(os.path.join(path, "log", name)) as f:
            pids.append(int(f.read()))
    send = psutil.Process(pids[0])
    procs = [send, psutil.Process(pids[1])] + send.children()
    names = set()
    for proc in procs:
        command = proc.cmdline()
        if AS_ROOT:
            assert os.path.dirname(command[1]) == os.path.join(venv, "bin"), command
            names.add(os.path.basename(command[1]))
            continue
        assert command[1] == "-IS" and os.path.dirname(command[2]) == os.path.join(path, "bin"), command
        names.add(os.path.basename(command[2]))
    assert names == {"qmail-send", "qmail-qmqpd", "qmail-lspawn", "qmail-rspawn", "qmail-clean"}


def test_init_rewrites_launchers_and_removes_its_own_stale_ones(venv, home):
    path, env = home
    bindir = os.path.join(path, "bin")
    with open(os.path.join(bindir, "qmail-queue"), "w") as f:
        f.write("#!/bin/sh\nexit 111\n")
    stale = os.path.join(bindir, "qmail-gone")
    shutil.copy(os.path.join(bindir, "qmail-send"), stale)
    mine = os.path.join(bindir, "my-filter")
    with open(mine, "w") as f:
        f.write("#!/bin/sh\ncat\n")
    done = subprocess.run([os.path.join(venv, "bin", "qmailctl"), "init", "--home", path], env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert shebang(os.path.join(bindir, "qmail-queue")).endswith(" -IS\n")
    assert not os.path.exists(stale)
    assert os.path.exists(mine)                   # not written by init: left alone


def test_man_pages_are_installed_where_man_finds_them(venv):
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    env = dict(os.environ, PATH=os.path.join(venv, "bin") + ":/usr/bin:/bin")
    env.pop("MANPATH", None)
    for section, page in (("8", "qmail-send"), ("8", "qmailctl"), ("5", "qmail-queue")):
        done = subprocess.run(["man", "-w", section, page], env=env, capture_output=True, timeout=60)
        assert done.stdout.decode().strip() == os.path.join(venv, "share", "man", "man" + section,
                                                            "%s.%s" % (page, section)), done.stderr


def test_init_refuses_a_python_the_accounts_cannot_run(venv, tmp_path):
    """As root: an interpreter in a directory only root may enter (pyenv under /root) would
    give daemons that cannot start; init says which account and what to do, and writes nothing."""
    if not AS_ROOT:
        pytest.skip("needs root: the check runs the interpreter as the home's accounts")
    base = os.path.dirname(venv)
    path = os.path.join(traversable_base(tmp_path), "home")
    os.chmod(base, 0o700)
    try:
        done = subprocess.run([os.path.join(venv, "bin", "qmailctl"), "init", "--home", path, "--me",
                               "test.example", "--user", "nobody"],
                              env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=60)
    finally:
        os.chmod(base, 0o755)
    err = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err, err
    assert err.startswith("qmailctl init: the account nobody cannot run %s with qmailpy (" %
                          os.path.join(venv, "bin", "python")), err
    assert "python3 -m venv /opt/qmailpy" in err
    assert not os.path.exists(path)


def test_check_flags_launchers_the_accounts_cannot_run(venv, home):
    """As root: a home whose launchers name an interpreter some account cannot run
    (written before that became so) fails qmailctl check, naming the account."""
    if not AS_ROOT:
        pytest.skip("needs root: the check runs the interpreter as the home's accounts")
    path, env = home
    qmailctl = os.path.join(path, "bin", "qmailctl")
    assert subprocess.run([qmailctl, "check", "--home", path], env=env, capture_output=True,
                          timeout=60).returncode == 0
    base = os.path.dirname(venv)
    os.chmod(base, 0o700)
    try:
        done = subprocess.run([qmailctl, "check", "--home", path], env=env, capture_output=True, timeout=60)
    finally:
        os.chmod(base, 0o755)
    out = done.stdout.decode()
    assert done.returncode == 1, out
    assert re.search(r"^the account nobody cannot run %s with qmailpy \(" % re.escape(os.path.join(venv, "bin", "python")),
                     out, re.M), out
