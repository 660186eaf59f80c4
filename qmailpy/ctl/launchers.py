"""The programs in QMAILHOME/bin: launchers that start Python without site (qmailctl(8) "init").

pip's console scripts start Python with `site`, which reads every .pth file of
the installation (for an editable install, setuptools' finder, which imports
pathlib and importlib.util): more time before the program's first line than
the interpreter start itself, paid by every message. A launcher runs the
interpreter that runs `qmailctl init` (sys.executable, so a virtualenv's own
python) as `python -IS` (no site, no PYTHON* variables, no user site) and puts
on sys.path itself, after the standard library, the directories that hold
qmailpy and the distributions it requires, as this interpreter finds them now:
a virtualenv's site-packages, a system `pip install`'s dist-packages with its
dependencies wherever they are, or an editable install's source tree.

Every console script of the qmailpy distribution gets one except those in
NOT_LAUNCHED. After a pip install that moves anything, `qmailctl init` again
rewrites them (it always does, atomically).
"""
import os
import re
import sys

MARK = "# Written by qmailctl init (qmailpy.ctl.launchers)"
# qmail-audit runs under spark-submit, which sets up its interpreter its own way.
NOT_LAUNCHED = frozenset({"qmail-audit"})
DISTRIBUTION = "qmailpy"


class LauncherError(Exception):
    pass


def _requirement_names(dist):
    """Names of the distributions dist requires unconditionally (extras left out)."""
    names = []
    for req in dist.requires or ():
        if "extra" in req.partition(";")[2]:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", req.strip())
        if name:
            names.append(name.group(0))
    return names


def package_paths():
    """The directories a launcher appends to sys.path: the one holding the qmailpy
    package first, then those holding its dependencies, each once."""
    import importlib.metadata
    import qmailpy
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(qmailpy.__file__)))]
    seen, todo = set(), [DISTRIBUTION]
    while todo:
        name = todo.pop(0)
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            if name == DISTRIBUTION:
                raise LauncherError("qmailpy is not installed (no package metadata): install it"
                                    " with pip to get the programs in QMAILHOME/bin")
            raise LauncherError("%s, which qmailpy requires, is not installed" % name)
        if name != DISTRIBUTION:
            where = os.path.abspath(str(dist.locate_file("")))
            if where not in paths:
                paths.append(where)
        todo.extend(_requirement_names(dist))
    return paths


def programs():
    """{program name: (module, function)} for every console script that gets a launcher."""
    import importlib.metadata
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise LauncherError("qmailpy is not installed (no package metadata): install it"
                            " with pip to get the programs in QMAILHOME/bin")
    found = {}
    for entry in dist.entry_points:
        if entry.group != "console_scripts" or entry.name in NOT_LAUNCHED:
            continue
        module, _, function = entry.value.partition(":")
        found[entry.name] = (module.strip(), function.strip())
    return found


def launcher_text(python, paths, module, function):
    return ("#!%s -IS\n" % python
            + MARK + ": starts Python without site; see qmailctl(8).\n"
            + "import sys\n"
            + "sys.path.extend(%r)\n" % (paths,)
            + "from %s import %s\n" % (module, function)
            + "sys.exit(%s())\n" % function)


def write(home, uid=None, gid=None, python=None):
    """Write HOME/bin/ and a launcher for each program (owned by uid:gid when given);
    launchers of ours for programs that are gone are removed. The names written."""
    from qmailpy.home import BIN
    python = python or sys.executable
    if not python or not os.path.isabs(python):
        raise LauncherError("cannot tell which python runs qmailctl (sys.executable is %r)" % python)
    if len("#!%s -IS" % python) > 255:
        raise LauncherError("the interpreter's path is too long for a #! line: %s" % python)
    wanted = programs()
    paths = package_paths()
    bindir = os.path.join(home, BIN)
    os.makedirs(bindir, 0o755, exist_ok=True)
    if uid is not None:
        os.chown(bindir, uid, gid)
    os.chmod(bindir, 0o755)
    for name, (module, function) in sorted(wanted.items()):
        path = os.path.join(bindir, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(launcher_text(python, paths, module, function))
        if uid is not None:
            os.chown(tmp, uid, gid)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    for name in os.listdir(bindir):
        if name not in wanted and _is_ours(os.path.join(bindir, name)):
            os.unlink(os.path.join(bindir, name))
    return sorted(wanted)


def _is_ours(path):
    try:
        with open(path, "rb") as f:
            lines = f.read(4096).split(b"\n")
    except OSError:
        return False
    return len(lines) > 1 and lines[1].startswith(MARK.encode())
