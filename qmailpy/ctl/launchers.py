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

Every console script of the qmailpy distribution gets one; those in
WITH_SITE start the interpreter with site, as pip's own script does (qmail-audit
runs Spark, whose workers start Python their own way), so that a unit can name
HOME/bin/qmail-audit whichever installation wrote it. After a pip install that
moves anything, `qmailctl init` again rewrites them (it always does, atomically).

HOME/man is made a symbolic link to the installation's share/man (where pip put
the pages), as qmail keeps its pages in /var/qmail/man: with HOME/bin on PATH,
man(1) looks in HOME/bin/../man.

Run as root, `qmailctl init` first checks that each account of the home can run
the interpreter and import qmailpy (check_runnable): a Python under /root, or a
package directory only root can read, would give daemons that cannot start.
"""
import os
import re
import sys

MARK = "# Written by qmailctl init (qmailpy.ctl.launchers)"
# qmail-audit runs Spark, which starts Python workers its own way: with site.
WITH_SITE = frozenset({"qmail-audit"})
DISTRIBUTION = "qmailpy"
MAN_LINK = "man"
# what the daemons import first: the queue server, and the module the issue saw missing
RUNNABLE_PROBE = "import qmailpy.cli.qmail_qmqpd, qmailpy.cli.qmail_send, resource"


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
        if entry.group != "console_scripts":
            continue
        module, _, function = entry.value.partition(":")
        found[entry.name] = (module.strip(), function.strip())
    return found


def launcher_text(python, paths, module, function, site=False):
    if site:
        return ("#!%s\n" % python
                + MARK + ": starts Python with site (its installation's); see qmailctl(8).\n"
                + "import sys\n"
                + "from %s import %s\n" % (module, function)
                + "sys.exit(%s())\n" % function)
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
    # through descriptors: in a single-user home bin/ is the user's, and root must not
    # write or chown through a name planted there (docs/security.md)
    from qmailpy import nofollow
    hfd = nofollow.open_path(home, "")
    try:
        try:
            os.mkdir(BIN, 0o755, dir_fd=hfd)
        except FileExistsError:
            pass
        bfd = nofollow.open_dir(BIN, hfd)
    finally:
        os.close(hfd)
    try:
        if uid is not None:
            os.fchown(bfd, uid, gid)
        os.fchmod(bfd, 0o755)
        for name, (module, function) in sorted(wanted.items()):
            _write_launcher(bfd, name, launcher_text(python, paths, module, function,
                                                     site=name in WITH_SITE), uid, gid)
        for name in os.listdir(bfd):
            if name not in wanted and _is_ours(bfd, name):
                os.unlink(name, dir_fd=bfd)
    finally:
        os.close(bfd)
    link_man(home)
    return sorted(wanted)


def man_dir():
    """The installation's share/man (the directory above man8/qmail-send.8), or None."""
    from qmailpy.installed import data_file
    page = data_file("share/man/man8/qmail-send.8")
    return os.path.dirname(os.path.dirname(page)) if page else None


def link_man(home):
    """HOME/man -> the installation's share/man, made through the home's descriptor;
    a HOME/man that is not a symbolic link (an administrator's own) is left alone."""
    target = man_dir()
    if target is None:
        return None
    from qmailpy import nofollow
    dfd = nofollow.open_path(home, "")
    try:
        try:
            if os.readlink(MAN_LINK, dir_fd=dfd) == target:
                return target
        except FileNotFoundError:
            pass
        except OSError:              # not a symbolic link: not ours to replace
            return None
        tmp = MAN_LINK + ".tmp"
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        os.symlink(target, tmp, dir_fd=dfd)
        os.rename(tmp, MAN_LINK, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return target


def written_by(home, program="qmail-send"):
    """(python, paths) of the launcher HOME/bin/program that init wrote, or None when
    there is none (a home laid out by qmail itself, or not initialized yet)."""
    import ast
    from qmailpy import nofollow
    from qmailpy.home import BIN
    try:        # through bin/'s descriptor: a single-user home's bin/ is its user's (a FIFO hung root)
        dfd = nofollow.open_path(home, BIN)
        try:
            fd = nofollow.open_file(program, dfd)
        finally:
            os.close(dfd)
        with os.fdopen(fd) as f:
            text = f.read(65536)
    except (OSError, UnicodeDecodeError):
        return None
    shebang = re.match(r"#!(\S+) -IS\n", text)
    extend = re.search(r"^sys\.path\.extend\((.*)\)$", text, re.M)
    if MARK not in text or not shebang or not extend:
        return None
    return shebang.group(1), ast.literal_eval(extend.group(1))


def check_runnable(roles, python=None, paths=None):
    """Raises LauncherError naming the first account of roles (control/roles' table) that
    cannot start python -IS and import qmailpy from the launchers' paths (by default this
    interpreter's), and what to do."""
    import subprocess
    from qmailpy import privs
    python = python or sys.executable
    accounts = [(privs.uid_of_name(roles[role]), privs.gid_of_name(roles[privs.ROLE_GROUP.get(role, "qmail")]))
                for role in privs.USER_ROLES]
    paths = package_paths() if paths is None else paths
    probe = "import sys; sys.path.extend(%r); %s" % (paths, RUNNABLE_PROBE)
    for uid, gid in sorted(set(accounts)):
        try:
            done = subprocess.run([python, "-IS", "-c", probe], user=uid, group=gid, extra_groups=[],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, cwd="/", env={}, timeout=60)
            error = done.stderr.decode(errors="replace").strip().splitlines()[-1:] if done.returncode else None
        except OSError as e:
            error = [e.strerror]
        if error is not None:
            import pwd
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            raise LauncherError(
                "the account %s cannot run %s with qmailpy (%s): the daemons would not start. Install "
                "qmailpy where every account can read it, e.g. python3 -m venv /opt/qmailpy && "
                "/opt/qmailpy/bin/pip install ., then run /opt/qmailpy/bin/qmailctl init"
                % (name, python, (error or ["exit %d" % done.returncode])[0]))


def _write_launcher(bfd, name, text, uid, gid):
    """bin/NAME, written as a fresh NAME.tmp and renamed, all through bin/'s descriptor."""
    from qmailpy import nofollow
    nofollow.replace(bfd, name, text.encode(), 0o755, None if uid is None else (uid, gid))


def _is_ours(bfd, name):
    from qmailpy import nofollow
    try:
        fd = nofollow.open_file(name, bfd)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        lines = f.read(4096).split(b"\n")
    return len(lines) > 1 and lines[1].startswith(MARK.encode())
