"""README.md's "On a mail server" section, run as written (issue 25 point 1): as root, in a
private mount namespace whose /etc, /opt, /var, /home, /usr/sbin and checkout are overlays on
throw-away directories, so the commands create accounts, /opt/qmailpy, /var/qmail and the
sendmail link for this test alone. The commands are read from README.md itself: when the
README and the code drift apart, this fails.

Three things differ from a fresh Debian, each said here: there is no package index (pip is
told --no-index and --no-deps through its environment, and the virtualenv the README makes
gets a .pth naming the directories where this interpreter has qmailpy's dependencies, as
bench/fresh_install.py does; qmailpy itself is really built and installed from the checkout);
there is no systemd to talk to (the `systemctl` lines are skipped; `systemd-analyze verify`
runs); pip's cache is off. Then the installed server is used without systemd: check, start,
a local user's Maildir made as the README says, a message through /usr/sbin/sendmail, stop."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

from qmailpy.ctl.launchers import package_paths

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERLAID = ("/etc", "/opt", "/var", "/home", "/usr/sbin", ROOT)
VENV = "/opt/qmailpy"


def readme_commands():
    """The indented command block of README.md's "### On a mail server" section."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("\n### On a mail server\n", 1)[1]
    block = re.search(r"\n\n((?: {4}.*\S.*\n)+)", section).group(1)
    commands = []
    for line in block.splitlines():
        if line.startswith(" " * 8):            # a command's continuation
            commands[-1] += " " + line.strip()
        else:
            commands.append(line[4:])
    return commands


def namespace_script(commands, upper):
    mounts = []
    for i, path in enumerate(OVERLAID):
        u, w = os.path.join(upper, "u%d" % i), os.path.join(upper, "w%d" % i)
        mounts.append("mkdir -p %s %s && mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s"
                      % (u, w, path, u, w, path))
    deps = "\n".join(package_paths()[1:])
    site = "%s/lib/python%d.%d/site-packages" % ((VENV,) + sys.version_info[:2])
    lines = ["set -e", "mount --make-rprivate /"] + mounts + [
        "cd %s" % shlex.quote(ROOT),
        "export PIP_NO_INDEX=1 PIP_NO_DEPS=1 PIP_NO_BUILD_ISOLATION=0 PIP_NO_CACHE_DIR=1"
        " PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_COMPILE=1",
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "unset QMAILHOME MANPATH PYTHONPATH VIRTUAL_ENV",
    ]
    for command in commands:
        if command.startswith("systemctl "):
            lines.append("echo 'skipped (no systemd here): %s'" % command.replace("'", ""))
            continue
        lines.append("echo \"+ $(date +%%s.%%N | cut -c7-14) %s\"" % command.replace('"', "").replace("$", ""))
        if command.startswith("systemd-analyze verify"):      # warnings exit 0: none may be said
            lines.append("said=$(%s 2>&1) || true; [ -z \"$said\" ] || { echo \"$said\"; exit 1; }" % command)
            continue
        lines.append(command)
        if command.startswith("python3 -m venv %s" % VENV):
            lines.append("printf '%%s\\n' %s > %s/qmailpy-dependencies.pth"
                         % (" ".join(shlex.quote(d) for d in deps.split("\n")), site))
    lines += [
        "echo \"+ $(date +%s.%N | cut -c7-14) after the README\"",
        "test \"$(man -w 8 qmail-send)\" = /var/qmail/man/man8/qmail-send.8",
        "qmailctl check --home /var/qmail",
        "useradd -m -s /bin/sh bob",
        "su bob -c 'maildirmake ~/Maildir'",
        "qmailctl start --home /var/qmail",
        "printf 'Subject: installed\\n\\nhello\\n' | /usr/sbin/sendmail -f root bob@mail.example.com",
        "n=0; until [ -n \"$(ls /home/bob/Maildir/new)\" ]; do"
        " n=$((n+1)); [ $n -lt 600 ] || { cat /var/qmail/log/qmail-send.log; exit 1; }; sleep 0.05; done",
        "grep -q '^Subject: installed$' /home/bob/Maildir/new/*",
        "qmailctl stat --home /var/qmail",
        "qmailctl stop --home /var/qmail",
        "echo \"+ $(date +%s.%N | cut -c7-14) stopped\"",
        "echo INSTALLED-AND-DELIVERED",
    ]
    return "\n".join(lines) + "\n"


def test_the_readme_server_section_as_written():
    if os.geteuid() != 0:
        pytest.skip("the README's server section runs as root")
    if shutil.which("unshare") is None or shutil.which("useradd") is None:
        pytest.skip("unshare or useradd is missing")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && mount -t tmpfs t /mnt"],
                           capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("no private mount namespace here: %s" % probe.stderr.decode().strip())
    commands = readme_commands()
    assert any(c.startswith("python3 -m venv %s" % VENV) for c in commands), commands
    # a directory of our own: pytest sessions running side by side prune each other's tmp_path
    base = tempfile.mkdtemp(prefix="qmailpy-readme-")
    try:
        script = os.path.join(base, "readme.sh")
        with open(script, "w") as f:
            f.write(namespace_script(commands, os.path.join(base, "overlay")))
        done = subprocess.run(["unshare", "-m", "bash", script], capture_output=True, timeout=600,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0 and "INSTALLED-AND-DELIVERED" in out, out[-6000:]
    assert "systemd-analyze verify" in out                  # it ran, and said nothing
    assert not os.path.exists("/var/qmail") and not os.path.exists(VENV)
