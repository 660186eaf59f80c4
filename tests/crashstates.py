"""A crash-state explorer (after ALICE, OSDI 2014, and CrashMonkey) for the crash tests.

A SIGKILL leaves the page cache intact; a power cut does not. This module builds the
states a disk may hold after a power cut in the middle of a protocol:

1. record() or start_recording(): run a protocol under strace against real directories
   (the roots: a home's queue/, control/, the users' homes with their Maildirs),
   starting from a copy of them taken before the run (`pre`, one folder per root, see
   snapshot()); every file-system call under a root is
   turned into a logical operation on paths and inodes (Op): create, write (offset and
   bytes), truncate, utime (atime and mtime: a not-before time is a mess file's mtime),
   link, rename, unlink, mkdir, rmdir, fsync of a file, fsync of a directory. The exit
   of each process named in the protocol's manifest with status 0 is an
   acknowledgement, placed between the operations where strace saw it. Calls that
   change files and are not modelled are listed in UNTRACED_CALLS; the tests fail
   when qmailpy starts using one.
2. states(): for every prefix of the operations, the operations not yet durable may be
   lost. Data (writes, truncates, times) becomes durable by a later fsync of its inode;
   names (create, link, rename, unlink, mkdir, rmdir) by a later fsync of their
   directory (both directories for a rename). Generated: every prefix; every prefix
   with each single non-durable operation dropped (an append together with the file's
   later unsynced appends: ext4 data=ordered keeps a prefix of a file's unsynced
   appends, see with_later_appends); every prefix with all of them dropped; every
   prefix with its last non-durable write torn at each sector boundary (512 B) inside
   it and at its half. On request: every prefix with all of them dropped but one name
   operation (single_keeps); pairs of them dropped, all or a seeded sample per prefix
   (pair_drops); each earlier non-durable write torn at its half (earlier_tears).
   Identical trees are explored once for each number of acknowledgements made by then.
   Name operations are treated as POSIX allows, not as ext4's journal orders them:
   any one may be lost while later ones are kept, or kept while earlier ones are lost.
   A directory whose mkdir was lost takes everything made in it along (Tree.prune).
3. materialise(): the pre-run copy plus the operations a state keeps, written into the
   roots with their times; the home's other files (users/, bin/) stay as they are.

Each dimension has a known-bad variant of the code that only it catches
(tests/crash_variants.py, tests/test_crash_states.py): a lost directory taking its
contents, queue/log's mkdir not synced (log_dir_unsynced); mtimes, a not-before time
set after the fsync (not_before_after_fsync); the checkpoints across a FINISH, issue
29's order (unlink_before_checkpoint); a tear at a sector boundary, a record header read past the data (short_header_read: an append that
starts 5 bytes before a boundary, cut there, leaves 5 bytes; the cut at half leaves a
whole header); an earlier write torn, recovery that takes a bad record for the end of
the log (corrupt_read_as_torn_end: the good records after it, qmail-queue's after the
crash included, are cut away; a torn last write is a torn end, and an append is lost
only with the later ones); a pair of drops, a conclusion drawn from two names that are
never synced (pid_name_means_unfinished: the pid/ name's unlink and intd/n's creation,
each harmless lost alone); one unsynced kept, the body's removal kept with the todo/ and
info/ removals lost (bodiless_todo_kept_while_info_is_there; _end_without_body in the
directory backend was found so, see test_dir_send_run); inode reuse, below.

Inode numbers: hold() keeps every removed file's inode allocated and a rebuilt file
gets a new inode, so a recording never reuses a message number by itself (ext4 gives a
new file the lowest free inode of its block group: on this busy disk 0 of 10 new
messages took the number just freed). renumber() synthesises the reuse on the
directory backend: a message b queued after message a's body is gone
(tests/reuse_scenario.py) is renamed to a's number in every operation from its mess/
link on (paths, and the fsyncs of its split directories). The states kept are those
that lost an unsynced removal of a's files and kept a's body removal and b's link (one
fsync of mess/S/ makes both durable). Checked: b reaches b@, and no one gets a message
not sent to them (Explorer.own_recipients). Caught: leftovers_inherited, qmail's own
preprocessing (an earlier life's channel files removed only when info/ is there too).
Found: the directory backend does not make the unlinks of todo/n (preprocessing),
info/S/n and the channel files (completion) durable before qmail-clean removes the
body, so a state that keeps b at a's number and loses one of them brings a back with
b's body for a's recipients (a xfail test, strict, until the backend is changed).
POSIX allows that state; ext4's journal, which commits name operations in order, does
not. Not synthesised: the log backend (b's number is inside its records too: ENVELOPE,
snapshots, START, DELIVERY, FINISH, each with its CRC-32C to recompute, same sizes, and
in the checkpoint and counts files written after it; the states to keep: a's FINISH
lost while b's mess/S/a is kept). The kill-campaign defect in LogRecovery._clean_replayed
(a body cleaned without the exclusive flock on queue/) needs a qmail-queue running
across the recovery: no power-cut state has one; tests/test_logqueue_reused_number.py
covers it.

Tears: a tear keeps a prefix of one write. Every write the recorded protocols make past
a sector is an append (segment records, bodies, Maildir files, checkpoint and counts
temporaries), and a torn append leaves a record or file shorter than it declares: the
log rejects it by its length before its CRC (log/records.py decode_one), a checkpoint or
counts temporary is fsync'd (or checksummed) before its rename. A cut at a sector
boundary therefore finds what the cut at half does, except where it leaves less than a
record header (12 bytes) of an append (short_header_read). The writes made in place
(the 1-byte garbage flag, the 56-byte commit word) cross no sector.

Paths in a Tree and an Op are relative to pre: "queue/mess/3/123", "homes/a/Maildir/new/x".

The checks (what recovery must achieve in each state) belong to the test that uses this.
"""
import hashlib
import os
import random
import re
import shutil
import stat
import subprocess

import knobs

O_CREAT, O_EXCL, O_TRUNC, O_APPEND, O_DIRECTORY = 0o100, 0o200, 0o1000, 0o2000, 0o200000
AT_REMOVEDIR = 0x200
CLONE_FS, CLONE_FILES, CLONE_THREAD = 0x200, 0x400, 0x10000

SYSCALLS = ("execve,clone,clone3,fork,vfork,chdir,open,openat,creat,write,pwrite64,writev,"
            "pwritev,lseek,rename,renameat,renameat2,link,linkat,unlink,unlinkat,rmdir,"
            "ftruncate,truncate,fsync,fdatasync,mkdir,mkdirat,close,dup,dup2,dup3,utimensat")
# Calls that change files under a root and that parse() does not model: a protocol
# using one would be explored wrongly. tests/test_crash_states.py scans qmailpy/ for
# the Python calls that make them (UNTRACED_CALLS) and fails on any it does not know.
UNTRACED_CALLS = {
    "os.fallocate": "fallocate", "os.posix_fallocate": "fallocate",
    "os.copy_file_range": "copy_file_range", "os.sendfile": "sendfile", "os.splice": "splice",
    "os.pwritev": "pwritev2 (with flags)", "os.symlink": "symlink", "os.mknod": "mknod",
    "os.mkfifo": "mknod", "O_TMPFILE": "openat(O_TMPFILE) + linkat(AT_EMPTY_PATH)",
    "shutil.copy": "copy_file_range/sendfile", "shutil.move": "copy_file_range/sendfile",
}

DATA_OPS = ("write", "truncate", "utime")      # durable by an fsync of their inode
SECTOR = 512
# QMAILPY_TEST_CRASHSTATES_POSIX_APPENDS=1: any one unsynced append may be lost while later ones are
# kept (POSIX allows it; ext4 data=ordered does not, see with_later_appends).
POSIX_APPENDS = knobs.CRASHSTATES_POSIX_APPENDS
NAME_OPS = ("create", "link", "rename", "unlink", "mkdir", "rmdir")


def strace_available():
    return shutil.which("strace") is not None


class Op:
    """One logical disk operation. kind, and by kind:
    create path ino | write ino off data | truncate ino size | utime ino data=(atime_ns,
    mtime_ns) | link ino path | rename src dst ino | unlink path | mkdir path | rmdir path |
    fsync ino | fsyncdir path"""
    __slots__ = ("kind", "path", "dst", "ino", "off", "data", "size", "pid", "append")

    def __init__(self, kind, pid, path=None, dst=None, ino=None, off=0, data=b"", size=0):
        self.kind, self.pid, self.path, self.dst, self.ino = kind, pid, path, dst, ino
        self.off, self.data, self.size = off, data, size
        self.append = False             # a write at or past the file's end when made

    def dirs(self):
        """The directories whose fsync makes this name operation durable."""
        if self.kind == "rename":
            return {os.path.dirname(self.path), os.path.dirname(self.dst)}
        return {os.path.dirname(self.path)}

    def __repr__(self):
        if self.kind == "write":
            return "write(%s @%d, %d bytes)" % (self.ino, self.off, len(self.data))
        if self.kind == "truncate":
            return "truncate(%s, %d)" % (self.ino, self.size)
        if self.kind == "utime":
            return "utime(%s, mtime %d)" % (self.ino, self.data[1] // 10 ** 9)
        if self.kind == "rename":
            return "rename(%s -> %s)" % (self.path, self.dst)
        if self.kind in ("fsync",):
            return "fsync(%s)" % self.ino
        return "%s(%s%s)" % (self.kind, self.path, "" if self.ino is None else " " + str(self.ino))


# -- the tree model -----------------------------------------------------------------
class Tree:
    """Names (relative paths) -> inodes, inode contents and times, directories; what a disk holds."""

    def __init__(self, names, contents, dirs, fifos=frozenset(), times=None):
        self.names, self.contents, self.dirs = names, contents, dirs
        self.fifos = fifos              # named pipes (lock/trigger): as before the run
        self.times = times if times is not None else {}    # ino -> (atime_ns, mtime_ns)

    @classmethod
    def scan(cls, root):
        names, contents, dirs, fifos, times = {}, {}, set(), set(), {}
        for dirpath, dirnames, filenames in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            dirs.add("" if rel == "." else rel)
            for name in filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if stat.S_ISFIFO(st.st_mode):
                    fifos.add(os.path.relpath(path, root))
                if not stat.S_ISREG(st.st_mode):
                    continue
                ino = "p%d" % st.st_ino
                names[os.path.relpath(path, root)] = ino
                if ino not in contents:
                    with open(path, "rb") as f:
                        contents[ino] = f.read()
                    times[ino] = (st.st_atime_ns, st.st_mtime_ns)
        return cls(names, contents, dirs, frozenset(fifos), times)

    def copy(self):
        return Tree(dict(self.names), dict(self.contents), set(self.dirs), self.fifos, dict(self.times))

    def size(self, ino):
        return len(self.contents.get(ino, b""))

    def apply(self, op, keep=None):
        """Apply op; a write with `keep` set writes only its first `keep` bytes (torn)."""
        k = op.kind
        if k == "create":
            self.contents.setdefault(op.ino, b"")
            self.names[op.path] = op.ino
        elif k == "write":
            data = op.data if keep is None else op.data[:keep]
            old = self.contents.get(op.ino, b"")
            if len(old) < op.off:
                old = old + b"\0" * (op.off - len(old))
            self.contents[op.ino] = old[:op.off] + data + old[op.off + len(data):]
        elif k == "truncate":
            old = self.contents.get(op.ino, b"")
            self.contents[op.ino] = old[:op.size] + b"\0" * max(0, op.size - len(old))
        elif k == "utime":
            old = self.times.get(op.ino, (None, None))
            self.times[op.ino] = tuple(new if new is not None else was for new, was in zip(op.data, old))
        elif k == "link":
            self.names[op.path] = op.ino
        elif k == "rename":
            if op.path in self.names:
                self.names[op.dst] = self.names.pop(op.path)
            elif op.path in self.dirs:
                moved = {p for p in self.dirs if p == op.path or p.startswith(op.path + "/")}
                for p in moved:
                    self.dirs.discard(p)
                    self.dirs.add(op.dst + p[len(op.path):])
                for p in [p for p in self.names if p.startswith(op.path + "/")]:
                    self.names[op.dst + p[len(op.path):]] = self.names.pop(p)
        elif k == "unlink":
            self.names.pop(op.path, None)
        elif k == "mkdir":
            self.dirs.add(op.path)
        elif k == "rmdir":
            self.dirs.discard(op.path)

    def prune(self):
        """A directory whose own name was lost takes what was made in it along: drop the
        directories and names whose parent directory the tree does not hold."""
        for d in sorted(self.dirs, key=len):
            parent = d.rpartition("/")[0]           # os.path.dirname of a relative path
            if d and parent and parent not in self.dirs:
                self.dirs.discard(d)
        for path in [p for p in self.names if p.rpartition("/")[0] not in self.dirs]:
            del self.names[path]
        self.fifos = frozenset(p for p in self.fifos if p.rpartition("/")[0] in self.dirs)

    def key(self, digests=None):
        """Identity of the tree: names, which names share an inode, and contents.
        digests: a dict {contents: sha256} kept across calls (trees share their contents)."""
        digests = {} if digests is None else digests
        h = hashlib.sha256()
        first = {}
        for path in sorted(self.names):
            ino = self.names[path]
            first.setdefault(ino, path)
            data = self.contents.get(ino, b"")
            digest = digests.get(data)
            if digest is None:
                digest = digests[data] = hashlib.sha256(data).digest()
            h.update(b"%s\0%s\0%s\0%r\n" % (path.encode(), first[ino].encode(), digest,
                                             self.times.get(ino)))
        for d in sorted(self.dirs):
            h.update(b"d %s\n" % d.encode())
        return h.hexdigest()


# -- parsing strace's output --------------------------------------------------------
_LINE = re.compile(r"^(\d+) +(.*)$")
_CALL = re.compile(r"^([a-z0-9_]+)\((.*)\) += (-?\d+|\?)(<[^>]*>)?")
_HEX = re.compile(r"\\x([0-9a-f]{2})")


def _unhex(s):
    return bytes(int(h, 16) for h in _HEX.findall(s))


def _split_args(s):
    """Top-level comma-separated arguments of one strace call."""
    out, depth, cur, quoted = [], 0, [], False
    i = 0
    while i < len(s):
        c = s[i]
        if quoted:
            cur.append(c)
            if c == "\\":
                cur.append(s[i + 1])
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
            cur.append(c)
        elif c in "[{<(":
            depth += 1
            cur.append(c)
        elif c in "]}>)":
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        out.append("".join(cur).strip())
    return out


def _string(arg):
    return _unhex(arg) if arg.startswith('"') else None


def _fd(arg):
    """(number, path or None) of an fd argument like 3<\\x2f...>."""
    m = re.match(r"^(-?\d+)(?:<(.*)>)?(?:\(deleted\))?$", arg)
    if not m:
        return None, None
    return int(m.group(1)), (_unhex(m.group(2)).decode("utf-8", "surrogateescape") if m.group(2) else None)


def _int(arg):
    return int(arg.split()[0], 0)


class _Proc:
    def __init__(self, fds, cwd, early=False):
        self.fds, self.cwd = fds, cwd        # fds: {n: [kind, ino-or-path, offset, append]}
        # strace may show a new process's first calls before its parent's clone returns:
        # until then it is `early` and the fds it closes are noted, to apply to what it
        # inherited once the clone is read
        self.early, self.closed = early, set()


class Recording:
    """ops, acks {tag: index into ops}, pre (path of the pre-run copy), roots."""

    def __init__(self, roots, pre, ops, acks, exits):
        self.roots, self.pre, self.ops, self.acks, self.exits = roots, pre, ops, acks, exits


def parse(trace_path, roots, pre, manifest):
    """The Recording of strace output in trace_path for roots ({name: directory}), whose
    pre-run copy is pre (see snapshot()). manifest: {pid: tag}; a tag is acknowledged
    where its pid exits 0."""
    roots = {name: os.path.realpath(path) for name, path in roots.items()}
    live = Tree.scan(pre)
    ops, acks, exits = [], {}, {}
    procs, pending = {}, {}
    counter = [0]

    def rel(path):
        if path is None:
            return None
        path = os.path.normpath(path)
        for name, root in roots.items():
            if path == root:
                return name
            if path.startswith(root + "/"):
                return name + path[len(root):]
        return None

    def proc(pid):
        p = procs.get(pid)
        if p is None:
            p = procs[pid] = _Proc({}, None, early=True)
        return p

    def resolve(pid, dirarg, patharg):
        name = _string(patharg)
        if name is None:
            return None
        name = name.decode("utf-8", "surrogateescape")
        if name.startswith("/"):
            return rel(name)
        if dirarg is None:
            base = proc(pid).cwd
        else:
            base = _fd(dirarg)[1]
            if dirarg.startswith("-100") and base:
                proc(pid).cwd = base
        return rel(os.path.join(base, name)) if base else None

    def emit(op):
        ops.append(op)
        live.apply(op)

    def new_ino():
        counter[0] += 1
        return "n%d" % counter[0]

    def handle(pid, name, args, ret, retpath):
        p = proc(pid)
        if name in ("open", "openat", "creat"):
            if ret < 0:
                return
            if name == "openat":
                path = resolve(pid, args[0], args[1])
                flags = _int(args[2])
            elif name == "open":
                path = resolve(pid, None, args[0])
                flags = _int(args[1])
            else:
                path = resolve(pid, None, args[0])
                flags = O_CREAT | O_TRUNC | 1
            if retpath is not None and rel(retpath) is not None:
                path = rel(retpath)
            if path is None:
                p.fds.pop(ret, None)
                return
            if path in live.dirs or flags & O_DIRECTORY:
                p.fds[ret] = ["dir", path, 0, False]
                return
            ino = live.names.get(path)
            if ino is None:
                if not flags & O_CREAT:
                    return
                ino = new_ino()
                emit(Op("create", pid, path=path, ino=ino))
            elif flags & O_TRUNC and live.size(ino):
                emit(Op("truncate", pid, ino=ino, size=0))
            p.fds[ret] = ["file", ino, 0, bool(flags & O_APPEND)]
        elif name in ("write", "pwrite64", "writev", "pwritev"):
            fd = _fd(args[0])[0]
            f = p.fds.get(fd)
            if f is None or f[0] != "file" or ret <= 0:
                return
            if name in ("write", "pwrite64"):
                data = _string(args[1])
            else:
                data = b"".join(_unhex(m) for m in re.findall(r'iov_base="((?:\\x[0-9a-f]{2})*)"', args[1]))
            data = data[:ret]
            if name in ("pwrite64", "pwritev"):
                off = _int(args[-1])
            else:
                off = live.size(f[1]) if f[3] else f[2]
                f[2] = off + ret
            op = Op("write", pid, ino=f[1], off=off, data=data)
            op.append = off >= live.size(f[1])
            emit(op)
        elif name == "utimensat":
            if ret < 0:
                return
            if args[1] == "NULL":            # futimens(fd, ...)
                f = p.fds.get(_fd(args[0])[0])
                ino = f[1] if f is not None and f[0] == "file" else None
            else:
                ino = live.names.get(resolve(pid, args[0], args[1]))
            stamps = re.findall(r"tv_sec=(\d+), tv_nsec=(\d+)", args[2])
            if ino is None or args[2] == "NULL" or len(stamps) != 2:
                return                          # "now" or UTIME_OMIT: no time to model
            emit(Op("utime", pid, ino=ino, data=tuple(int(a) * 10 ** 9 + int(b) for a, b in stamps)))
        elif name == "lseek":
            f = p.fds.get(_fd(args[0])[0])
            if f is not None and ret >= 0:
                f[2] = ret
        elif name in ("ftruncate", "truncate"):
            if ret < 0:
                return
            if name == "ftruncate":
                f = p.fds.get(_fd(args[0])[0])
                if f is None or f[0] != "file":
                    return
                ino = f[1]
            else:
                path = resolve(pid, None, args[0])
                ino = live.names.get(path)
                if ino is None:
                    return
            emit(Op("truncate", pid, ino=ino, size=_int(args[1])))
        elif name in ("fsync", "fdatasync"):
            f = p.fds.get(_fd(args[0])[0])
            if f is None or ret < 0:
                return
            emit(Op("fsyncdir", pid, path=f[1]) if f[0] == "dir" else Op("fsync", pid, ino=f[1]))
        elif name in ("rename", "renameat", "renameat2"):
            if ret < 0:
                return
            if name == "rename":
                src, dst = resolve(pid, None, args[0]), resolve(pid, None, args[1])
            else:
                src, dst = resolve(pid, args[0], args[1]), resolve(pid, args[2], args[3])
            if src is None or dst is None:
                return
            emit(Op("rename", pid, path=src, dst=dst, ino=live.names.get(src)))
        elif name in ("link", "linkat"):
            if ret < 0:
                return
            if name == "link":
                src, dst = resolve(pid, None, args[0]), resolve(pid, None, args[1])
            else:
                src, dst = resolve(pid, args[0], args[1]), resolve(pid, args[2], args[3])
            if dst is None or src not in live.names:
                return
            emit(Op("link", pid, path=dst, ino=live.names[src]))
        elif name in ("unlink", "unlinkat", "rmdir"):
            if ret < 0:
                return
            if name == "unlinkat":
                path = resolve(pid, args[0], args[1])
                isdir = _int(args[2]) & AT_REMOVEDIR
            else:
                path = resolve(pid, None, args[0])
                isdir = name == "rmdir"
            if path is not None:
                emit(Op("rmdir" if isdir else "unlink", pid, path=path))
        elif name in ("mkdir", "mkdirat"):
            if ret < 0:
                return
            path = resolve(pid, args[0], args[1]) if name == "mkdirat" else resolve(pid, None, args[0])
            if path is not None:
                emit(Op("mkdir", pid, path=path))
        elif name == "close":
            fd = _fd(args[0])[0]
            p.fds.pop(fd, None)
            if p.early:
                p.closed.add(fd)
        elif name in ("dup", "dup2", "dup3"):
            f = p.fds.get(_fd(args[0])[0])
            if ret >= 0:
                p.fds.pop(ret, None)
                if f is not None:
                    p.fds[ret] = f              # one open file description: shared offset
        elif name == "chdir":
            if ret == 0:
                target = _string(args[0]).decode("utf-8", "surrogateescape")
                p.cwd = os.path.normpath(os.path.join(p.cwd or "/", target))
        elif name in ("clone", "clone3", "fork", "vfork"):
            if ret <= 0:
                return
            m = re.search(r"flags=(0x[0-9a-f]+|\d+)", ",".join(args))
            flags = int(m.group(1), 0) if m else 0
            fds = p.fds if flags & CLONE_FILES else {k: v for k, v in p.fds.items()}
            child = procs.get(ret)
            if child is not None and child.early:     # its own calls came first (see _Proc)
                for fd in child.closed:
                    fds.pop(fd, None)
                fds.update(child.fds)
                procs[ret] = _Proc(fds, child.cwd or p.cwd)
            else:
                procs[ret] = _Proc(fds, p.cwd)

    with open(trace_path, "rb") as f:
        lines = f.read().decode("ascii", "replace").split("\n")
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        pid, rest = int(m.group(1)), m.group(2)
        if rest.startswith("+++ exited with "):
            code = int(rest.split()[3])
            exits[pid] = (code, len(ops))
            if code == 0 and pid in manifest:
                acks[manifest[pid]] = len(ops)
            continue
        if rest.startswith("+++") or rest.startswith("---"):
            continue
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[:-len("<unfinished ...>")].rstrip()
            continue
        r = re.match(r"^<\.\.\. [a-z0-9_]+ resumed>(.*)$", rest)
        if r:
            rest = pending.pop(pid, "") + r.group(1)
        c = _CALL.match(rest)
        if not c or c.group(3) == "?":
            continue
        name, argstr, ret = c.group(1), c.group(2), int(c.group(3))
        retpath = _fd(c.group(3) + c.group(4))[1] if c.group(4) else None
        if name == "execve":
            continue
        handle(pid, name, _split_args(argstr), ret, retpath)
    return Recording(roots, pre, ops, acks, exits)


SPLIT_KINDS = ("mess", "info", "local", "remote")     # queue/KIND/(n % split)/n
NUMBERED = SPLIT_KINDS + ("intd", "todo", "bounce", "hold")     # or queue/KIND/n


def renumber(rec, old, new, start, split):
    """Inode reuse, synthesised on the directory backend: the recording with the message
    numbered `old` renamed to `new` in every operation from index `start` (its mess/
    link) on, as if the file system had given it that inode: its paths (mess/S/n,
    intd/n, todo/n, info/S/n, local/S/n, remote/S/n, bounce/n, hold/n) and the fsyncs
    of its split directories. `split`: the queue's number of split directories. The
    recording must have no other message in old's split directories from `start` on
    (else their fsyncs would move too): checked."""
    def moved(path):
        parts = (path or "").split("/")
        if len(parts) < 3 or parts[0] != "queue" or parts[1] not in NUMBERED:
            return path
        if parts[-1] == str(old):
            if len(parts) == 4:
                parts[2] = str(new % split)
            parts[-1] = str(new)
        elif len(parts) == 3 and parts[1] in SPLIT_KINDS and parts[2] == str(old % split):
            parts[2] = str(new % split)        # the fsync of a split directory
        return "/".join(parts)

    ops = list(rec.ops[:start])
    for op in rec.ops[start:]:
        path = op.path or ""
        parts = path.split("/")
        if op.kind in NAME_OPS and len(parts) == 4 and parts[2] == str(old % split) and parts[3] != str(old):
            raise ValueError("%r shares msg %d's split directory" % (op, old))
        copy = Op(op.kind, op.pid, path=moved(op.path), dst=moved(op.dst), ino=op.ino, off=op.off,
                  data=op.data, size=op.size)
        copy.append = op.append
        ops.append(copy)
    return Recording(rec.roots, rec.pre, ops, rec.acks, rec.exits)


def snapshot(roots, pre):
    """Copy each root to pre/NAME (owners, modes and hard links kept): the pre-run state."""
    os.makedirs(pre)
    for name, path in roots.items():
        subprocess.run(["cp", "-a", path, os.path.join(pre, name)], check=True)


def hold(roots, holddir):
    """Hard-link every file under the roots into holddir (same file system): files the
    run removes keep their inodes, as the states before the removal still hold them.
    Not queue/lock/ (never removed; qmailctl refuses a lock file with a second link)."""
    os.makedirs(holddir)
    n = 0
    for name, path in roots.items():
        for dirpath, _, filenames in os.walk(path):
            if name == "queue" and os.path.relpath(dirpath, path).split("/")[0] == "lock":
                continue
            for filename in filenames:
                full = os.path.join(dirpath, filename)
                if stat.S_ISREG(os.lstat(full).st_mode):
                    n += 1
                    os.link(full, os.path.join(holddir, str(n)))


def _strace(argv, trace):
    return ["strace", "-f", "-q", "-X", "raw", "-xx", "-s", "1000000", "-y", "-o", trace,
            "-e", "trace=" + SYSCALLS] + list(argv)


def record(argv, workdir, env=None, cwd=None):
    """Run argv under strace (following forks) to its end; the trace's path. Take the
    snapshot() before, and let the program leave a manifest of its acknowledged runs."""
    trace = os.path.join(workdir, "trace")
    done = subprocess.run(_strace(argv, trace), env=env, cwd=cwd, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return trace


def start_recording(argv, workdir, env=None, cwd="/", stdout=None, pass_fds=()):
    """Start argv under strace for a daemon the caller stops; (Popen of strace, trace path).
    strace runs in a session of its own, so its tracees are one process group."""
    trace = os.path.join(workdir, "trace")
    proc = subprocess.Popen(_strace(argv, trace), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stdout, start_new_session=True, pass_fds=pass_fds)
    return proc, trace


# -- crash states ----------------------------------------------------------------------
class State:
    """A crash state: the first `prefix` ops, without `dropped`, with the writes in `torn`
    ({op index: bytes kept}) cut short."""

    def __init__(self, prefix, dropped=(), torn=None, how="prefix"):
        self.prefix, self.dropped, self.how = prefix, frozenset(dropped), how
        self.torn = dict(torn or {})

    def describe(self, rec):
        parts = ["crash after op %d of %d (%s)" % (self.prefix, len(rec.ops), self.how)]
        if self.prefix:
            parts.append("last op: %r" % rec.ops[self.prefix - 1])
        for i in sorted(self.dropped):
            parts.append("lost: #%d %r" % (i, rec.ops[i]))
        for i, keep in sorted(self.torn.items()):
            parts.append("torn after %d bytes: #%d %r" % (keep, i, rec.ops[i]))
        return "; ".join(parts)


def not_durable(ops, prefix):
    """Indexes of the first `prefix` ops that a power cut right after them may lose."""
    synced_ino, synced_dir = {}, {}          # last fsync index per inode / directory
    for j in range(prefix):
        op = ops[j]
        if op.kind == "fsync":
            synced_ino[op.ino] = j
        elif op.kind == "fsyncdir":
            synced_dir[op.path] = j
    out = []
    for i in range(prefix):
        op = ops[i]
        if op.kind in DATA_OPS:
            if synced_ino.get(op.ino, -1) < i:
                out.append(i)
        elif op.kind in NAME_OPS:
            if any(synced_dir.get(d, -1) < i for d in op.dirs()):
                out.append(i)
    return out


def with_later_appends(ops, lost, i, posix_appends=False):
    """[i], or for an append every unsynced append to the same file from i on: ext4
    (data=ordered, the file system this project targets) keeps a prefix of a file's
    unsynced appends, never later appended bytes behind a hole. Overwrites in place
    and name operations may still be lost one by one."""
    op = ops[i]
    if op.kind != "write" or not op.append or posix_appends:
        return [i]
    return [j for j in lost if j >= i and ops[j].kind == "write" and ops[j].ino == op.ino and ops[j].append]


def build(rec, state, base=None):
    tree = (base or Tree.scan(rec.pre)).copy()
    for i in range(state.prefix):
        if i in state.dropped:
            continue
        tree.apply(rec.ops[i], keep=state.torn.get(i))
    tree.prune()
    return tree


def sector_cuts(op):
    """Bytes of a write kept when a power cut tears it at a sector boundary (512 B, the
    unit a disk writes atomically), for every boundary inside it, and at its half."""
    cuts = {len(op.data) // 2}
    first = (op.off // SECTOR + 1) * SECTOR
    cuts.update(range(first - op.off, len(op.data), SECTOR))
    return sorted(c for c in cuts if 0 < c < len(op.data))


def pairs_of(items, limit, seed):
    """Every pair of items, or `limit` of them sampled (seeded: the same run explores the
    same states) when there are more."""
    pairs = [(a, b) for i, a in enumerate(items) for b in items[i + 1:]]
    if limit is not None and len(pairs) > limit:
        pairs = random.Random(seed).sample(pairs, limit)
    return pairs


def states(rec, single_drops=True, posix_appends=POSIX_APPENDS, single_keeps=False,
           pair_drops=0, earlier_tears=False, prefixes=None):
    """Distinct crash states of a recording (see the module docstring): [(State, Tree)].

    single_keeps: also every prefix with all its non-durable operations lost except one
    name operation ("one unsynced kept"), as when another process's fsync of the same
    directory made that one durable. pair_drops: also, per prefix, pairs of its
    non-durable operations lost together ("two unsynced lost"): all of them, or that
    many sampled (seeded) where there are more; None: all. earlier_tears: also every
    non-durable write but the last torn at its half ("earlier unsynced write torn").
    prefixes: only the states at these prefixes (a long recording's window)."""
    base = Tree.scan(rec.pre)
    seen, out, digests = set(), [], {}

    def add(state):
        tree = build(rec, state, base)
        # The same tree later in the run is checked again once more has been
        # acknowledged: kept as the earlier state, a lost acknowledged write was
        # checked against the expectations of before the acknowledgement.
        k = (tree.key(digests), sum(1 for at in rec.acks.values() if at <= state.prefix))
        if k not in seen:
            seen.add(k)
            out.append((state, tree))

    for prefix in range(len(rec.ops) + 1) if prefixes is None else sorted(prefixes):
        lost = not_durable(rec.ops, prefix)
        add(State(prefix))
        if lost:
            add(State(prefix, lost, how="all unsynced lost"))
        if single_drops:
            for i in lost:
                add(State(prefix, with_later_appends(rec.ops, lost, i, posix_appends), how="one unsynced lost"))
        if single_keeps:
            for i in lost:
                if rec.ops[i].kind in NAME_OPS:
                    add(State(prefix, [j for j in lost if j != i], how="one unsynced kept"))
        if pair_drops != 0:
            for i, j in pairs_of(lost, pair_drops, prefix):
                dropped = set(with_later_appends(rec.ops, lost, i, posix_appends))
                dropped.update(with_later_appends(rec.ops, lost, j, posix_appends))
                add(State(prefix, dropped, how="two unsynced lost"))
        writes = [i for i in lost if rec.ops[i].kind == "write" and len(rec.ops[i].data) > 1]
        if writes:
            for keep in sector_cuts(rec.ops[writes[-1]]):
                add(State(prefix, torn={writes[-1]: keep}, how="last unsynced write torn"))
        if earlier_tears:
            for i in writes[:-1]:
                add(State(prefix, torn={i: len(rec.ops[i].data) // 2}, how="earlier unsynced write torn"))
    return out


def materialise(tree, roots, owner_of, keep_dirs=False):
    """Make each root hold exactly its part of tree (replacing whatever it held), hard
    links included. owner_of(relpath) -> (uid, gid, mode) of each file and directory.
    keep_dirs: the directories the tree holds are kept (mode and owner set again) rather
    than removed and made again; every other entry under the roots is removed. The
    files are written as without it; only the directories' own times differ (never
    modelled: each is that of the materialisation either way). It spares the rmdir and
    mkdir of a queue's hundred-odd directories per state, each waiting on the journal."""
    root = os.geteuid() == 0
    for name, path in roots.items():
        if keep_dirs and os.path.isdir(path) and not os.path.islink(path) and name in tree.dirs:
            _clear_but_dirs(tree, name, path, owner_of, root)
        elif os.path.lexists(path):
            shutil.rmtree(path)

    def target(rel):
        name, _, rest = rel.partition("/")
        return os.path.join(roots[name], rest) if rest else roots[name]

    for d in sorted(tree.dirs):
        if d.split("/")[0] not in roots:
            continue                            # "" (pre itself)
        path = target(d)
        if keep_dirs and os.path.isdir(path):
            continue                            # kept: mode and owner set by _clear_but_dirs
        os.makedirs(path, exist_ok=True)
        uid, gid, mode = owner_of(d)
        os.chmod(path, mode)
        if root:
            os.chown(path, uid, gid)
    written = {}
    for path in sorted(tree.names):
        ino = tree.names[path]
        full = target(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)   # a name whose mkdir was lost
        if ino in written:
            os.link(written[ino], full)
            continue
        uid, gid, mode = owner_of(path)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, tree.contents.get(ino, b""))
            os.fchmod(fd, mode)
            if root:
                os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
        written[ino] = full
        if tree.times.get(ino):
            atime, mtime = tree.times[ino]
            os.utime(full, ns=(atime if atime is not None else mtime, mtime))
    for path in sorted(tree.fifos):
        full = target(path)
        if os.path.isdir(os.path.dirname(full)):
            uid, gid, mode = owner_of(path)
            os.mkfifo(full, mode)
            os.chmod(full, mode)
            if root:
                os.chown(full, uid, gid)


def _clear_but_dirs(tree, rel, path, owner_of, root):
    """materialise(keep_dirs=True) for one directory the tree holds: its mode and owner as
    owner_of says, its entries removed except the directories the tree holds (each
    cleared the same way)."""
    with os.scandir(path) as entries:
        for entry in list(entries):
            sub = rel + "/" + entry.name
            if entry.is_dir(follow_symlinks=False):
                if sub in tree.dirs:
                    _clear_but_dirs(tree, sub, entry.path, owner_of, root)
                else:
                    shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    st = os.lstat(path)
    uid, gid, mode = owner_of(rel)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    if root and (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid)


def owners(post, pre):
    """owner_of for materialise(): a path's owner and mode before the run (pre), else as
    the run left it (post), else its nearest existing parent directory's owner, mode 0640."""
    def owner_of(path):
        for base in (pre, post):
            try:
                st = os.lstat(os.path.join(base, path))
                return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
            except FileNotFoundError:
                pass
        parent = path
        while parent:
            parent = os.path.dirname(parent)
            try:
                st = os.lstat(os.path.join(pre, parent))
                return st.st_uid, st.st_gid, 0o640
            except FileNotFoundError:
                continue
        st = os.lstat(pre)
        return st.st_uid, st.st_gid, 0o640
    return owner_of
