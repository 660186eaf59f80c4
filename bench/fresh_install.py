"""A throw-away, non-editable `pip install` of this source tree, offline (used by
tests/test_launchers.py and bench/inject.py --fresh-install).

    venv = fresh_install(base)      # BASE/venv/bin/qmailctl, BASE/venv/lib/.../site-packages/qmailpy

The working tree's package sources are copied to BASE/src and built into a
wheel with the running interpreter's pip and setuptools (no build isolation, no
index); a new virtualenv (no pip of its own) gets the wheel with --no-deps,
through `pip --python`. qmailpy's dependencies are not installed again: a .pth
file puts the directories where the running interpreter has them on the new
venv's path, as a system `pip install` finds its dependencies in another
dist-packages. So the new venv holds a real, non-editable qmailpy (package,
console scripts, man pages) and nothing of the working tree.
"""
import glob
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "qmailpy", "spark", "queue-layout", "man")


def _run(argv):
    done = subprocess.run(argv, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(argv), done.returncode,
                                                     done.stderr.decode(errors="replace")[-3000:]))


def site_packages(venv):
    return os.path.join(venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")


def fresh_install(base):
    """Build and install into BASE/venv (BASE must exist); the venv's path."""
    from qmailpy.ctl.launchers import package_paths
    src, wheels, venv = (os.path.join(base, name) for name in ("src", "wheels", "venv"))
    os.mkdir(src)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(src, name), ignore=ignore)
        else:
            shutil.copy(source, src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, src])
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    _run(pip + ["--python", os.path.join(venv, "bin", "python"), "install", "--no-deps", "--no-index"]
         + glob.glob(os.path.join(wheels, "qmailpy-*.whl")))
    with open(os.path.join(site_packages(venv), "qmailpy-dependencies.pth"), "w") as f:
        f.write("".join(path + "\n" for path in package_paths()[1:]))
    return venv
