"""The installed hierarchy of a home (queue-layout/layout.conf): reading it, creating it, checking it.

Install-time code, for qmailctl init and check and for qmailctl convert's queue/log;
the per-message programs need only qmailpy.layout, the paths inside queue/.
"""
import os

from qmailpy.layout import SPLIT

LAYOUT_NAME = "layout.conf"
ENTRY_TYPES = ("dir", "split", "file", "fifo")


class LayoutError(ValueError):
    """layout.conf cannot be found or has a malformed line."""


class Entry:
    """One line of layout.conf: what PATH must be, who owns it, its mode."""
    __slots__ = ("type", "path", "owner", "group", "mode", "size")

    def __init__(self, type, path, owner, group, mode, size=None):
        self.type, self.path, self.owner, self.group = type, path, owner, group
        self.mode, self.size = mode, size

    def paths(self):
        """PATH, and for a split entry its subdirectories 0..22 after it."""
        if self.type != "split":
            return [self.path]
        return [self.path] + ["%s/%d" % (self.path, s) for s in range(SPLIT)]

    def __repr__(self):
        return "Entry(%r, %r, %r, %r, 0o%o, %r)" % (
            self.type, self.path, self.owner, self.group, self.mode, self.size)


def layout_file():
    """The installed layout.conf (sys.prefix/share/qmailpy, else where the distribution's
    file list says: qmailpy/installed.py), else the checkout's."""
    import sys
    candidates = [
        os.path.join(sys.prefix, "share", "qmailpy", "queue-layout", LAYOUT_NAME),
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "queue-layout", LAYOUT_NAME),
    ]
    for path in candidates:
        if os.path.isfile(path):
            return path
    from qmailpy.installed import data_file
    path = data_file("share/qmailpy/queue-layout/" + LAYOUT_NAME)
    if path is not None:
        return path
    raise LayoutError("cannot find %s (looked in %s)" % (LAYOUT_NAME, ", ".join(candidates)))


def parse_layout(text):
    """Entries from layout.conf text; LayoutError names the bad line."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (5, 6) or words[0] not in ENTRY_TYPES:
            raise LayoutError("layout.conf line %d: expected TYPE PATH OWNER GROUP MODE [SIZE]" % number)
        kind, path, owner, group, mode = words[:5]
        try:
            mode = int(mode, 8)
            size = int(words[5]) if len(words) == 6 else None
        except ValueError:
            raise LayoutError("layout.conf line %d: bad mode or size" % number) from None
        if size is not None and kind != "file":
            raise LayoutError("layout.conf line %d: only files have a size" % number)
        entries.append(Entry(kind, os.path.normpath(path), owner, group, mode, size))
    return entries


def load_layout(path=None):
    with open(path or layout_file()) as f:
        return parse_layout(f.read())


class Owners:
    """Resolves layout owner/group names to ids through the home's role table."""

    def __init__(self, home, roles=None):
        from qmailpy import privs
        self.roles = roles or privs.load_roles(home)
        self.single = privs.single_user(self.roles)
        self._uids, self._gids = {}, {}

    def uid(self, owner):
        from qmailpy import privs
        if owner not in self._uids:
            if owner == "root":
                name = self.single
                self._uids[owner] = 0 if name is None else privs.uid_of_name(name)
            else:
                self._uids[owner] = privs.uid_of_name(self.roles[owner])
        return self._uids[owner]

    def gid(self, group):
        from qmailpy import privs
        if group not in self._gids:
            self._gids[group] = privs.gid_of_name(self.roles[group])
        return self._gids[group]


def create_hierarchy(home, entries=None, owners=None, set_owners=False):
    """Create every entry that is missing and set modes (and owners when asked).

    Existing entries keep their contents; their mode and owner are set again,
    so running it twice is harmless. Returns the list of paths created. Run as
    root, it works in directories qmailq and qmails own: each name is opened
    relative to its parent's descriptor without following symlinks, and modes
    and owners are set through the descriptor (qmailpy.nofollow); a symlink, a
    linked file or an entry of the wrong type is a LayoutError.
    """
    from qmailpy import nofollow
    entries = load_layout() if entries is None else entries
    created = []
    old = os.umask(0)
    dirs = {}
    try:
        dirs["."] = nofollow.open_home(home)
        for entry in entries:
            for rel in entry.paths():
                try:
                    fd = _create_entry(dirs, rel, entry, created)
                except nofollow.Refused as e:
                    raise LayoutError("%s: %s: refused" % (os.path.join(home, rel), e.why)) from None
                try:
                    if set_owners:
                        os.fchown(fd, owners.uid(entry.owner), owners.gid(entry.group))
                    os.fchmod(fd, entry.mode)    # after chown, which clears setgid bits
                finally:
                    if rel not in dirs:
                        os.close(fd)
    finally:
        os.umask(old)
        for fd in dirs.values():
            os.close(fd)
    return created


def _create_entry(dirs, rel, entry, created):
    """A descriptor of rel, made first when missing; directories stay open in dirs
    (their children are made through them)."""
    import errno
    import stat
    from qmailpy import nofollow
    if rel == ".":
        return dirs["."]
    parent, name = os.path.split(rel)
    parent = parent or "."
    if parent not in dirs:
        raise LayoutError("layout.conf: %s comes before its directory" % rel)
    pfd = dirs[parent]
    mode = entry.mode & 0o777
    if entry.type in ("dir", "split"):
        try:
            os.mkdir(name, mode, dir_fd=pfd)
            created.append(rel)
        except FileExistsError:
            pass
        dirs[rel] = nofollow.open_dir(name, pfd)
        return dirs[rel]
    if entry.type == "fifo":
        try:
            os.mkfifo(name, mode, dir_fd=pfd)
            created.append(rel)
        except FileExistsError:
            pass
        return nofollow.open_file(name, pfd, kind=stat.S_IFIFO)       # Refused: what is there, why
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=pfd)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
        return nofollow.open_file(name, pfd)
    try:
        if entry.size:
            os.write(fd, b"\0" * entry.size)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    created.append(rel)
    return fd


def backend_is_log(home):
    """Whether the home uses the log backend (whose queue/log a dir home does without)."""
    from qmailpy.queuebackend import backend_name
    try:
        return backend_name(home) == "log"
    except ValueError:
        return False


def check_hierarchy(home, entries=None, owners=None, check_owners=True):
    """Every discrepancy between the home and the layout, as strings (empty = clean)."""
    import stat
    entries = load_layout() if entries is None else entries
    problems = []
    kinds = {"dir": stat.S_ISDIR, "split": stat.S_ISDIR, "file": stat.S_ISREG, "fifo": stat.S_ISFIFO}
    names = {"dir": "a directory", "split": "a directory", "file": "a regular file", "fifo": "a named pipe"}
    devices = {}
    log_backend = backend_is_log(home)
    for entry in entries:
        for rel in entry.paths():
            path = os.path.join(home, rel)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if rel == "queue/log" and not log_backend:
                    continue            # a home of real qmail: the log backend's directory is optional
                problems.append("%s: missing (should be %s)" % (rel, names[entry.type]))
                continue
            except OSError as e:
                problems.append("%s: cannot stat: %s" % (rel, e.strerror))
                continue
            devices[rel] = st.st_dev
            if not kinds[entry.type](st.st_mode):
                problems.append("%s: is not %s" % (rel, names[entry.type]))
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode != entry.mode:
                problems.append("%s: mode %04o, should be %04o" % (rel, mode, entry.mode))
            if check_owners and owners is not None:
                try:
                    uid, gid = owners.uid(entry.owner), owners.gid(entry.group)
                except Exception as e:      # PrivError: the role's account does not exist
                    problems.append("%s: cannot check owner: %s" % (rel, e))
                else:
                    if st.st_uid != uid:
                        problems.append("%s: owner uid %d, should be %d (%s)" % (
                            rel, st.st_uid, uid, entry.owner))
                    if st.st_gid != gid:
                        problems.append("%s: group gid %d, should be %d (%s)" % (
                            rel, st.st_gid, gid, entry.group))
            if entry.size is not None and st.st_size != entry.size:
                problems.append("%s: size %d, should be %d" % (rel, st.st_size, entry.size))
        if entry.type == "split":
            base = os.path.join(home, entry.path)
            for name in _listdir(base):
                if name.isdigit() and int(name) >= SPLIT:
                    problems.append("%s/%s: unexpected split directory (split is %d)" % (
                        entry.path, name, SPLIT))
    # qmail links across these directories: they must share a filesystem (docs/queue-format.md "Queue directory layout").
    for a, b in [("queue/pid", "queue/mess/%d" % s) for s in range(SPLIT)] + [("queue/intd", "queue/todo")]:
        if a in devices and b in devices and devices[a] != devices[b]:
            problems.append("%s: not on the same filesystem as %s" % (b, a))
    return problems


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []
