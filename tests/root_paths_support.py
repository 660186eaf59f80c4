"""Helpers for the tests of root's path races: root's secret file (the victim fixture), whether
it is still as root left it (unchanged), and a script run as the home's account (as_attacker).
"""
import os
import shutil
import stat
import subprocess
import sys

import pytest

SECRET = b"root's secret\n"


@pytest.fixture
def victim(tmp_path):
    """Root's file, in a directory nobody may traverse (so only its own mode keeps nobody out)."""
    from conftest import traversable_base
    base = traversable_base(tmp_path, "qmailpy-victim-")
    path = os.path.join(base, "victim")
    with open(path, "wb") as f:
        f.write(SECRET)
    os.chmod(path, 0o600)
    yield path
    shutil.rmtree(base, ignore_errors=True)


def unchanged(path):
    st = os.lstat(path)
    with open(path, "rb") as f:
        data = f.read()
    return (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), data) == (0, 0, 0o600, SECRET)


def as_attacker(home, script, *args):
    """A Popen of `python -c script args...` running as the home's account, lines on stdout."""
    return subprocess.Popen([sys.executable, "-c", script] + list(args), user=home.uid, group=home.gid,
                            extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
