"""Moving a stopped queue between the directory and the log backend (qmailctl convert).

Bodies stay where they are (mess/ is the same in both backends); only envelopes
and S5 state move. dir_to_log and log_to_dir write the target, make it durable,
read it back and compare it with the source (every message, sender, recipient,
DONE mark and bounce note); they never touch the source. The caller (qmailctl
convert) then switches control/queuebackend and only then calls remove_dir or
remove_log on the source; discarding a half-written target uses the same two.

The queue must be stopped: the caller holds lock/sendmutex and keeps qmail-queue
out for the whole run. `step(name)` is called at each point where a crash would
leave a different state on disk (tests kill the process there).
"""
import os
import stat

from qmailpy import envelope, nofollow, states
from qmailpy.backends.log import records as R
from qmailpy.backends.log.commit import LOG_DIR, LogWriter, fsync_dir, list_segments, segment_name
from qmailpy.backends.log.counts import COUNTS
from qmailpy.backends.log.queue import LogQueue
from qmailpy.backends.log.recovery import CHECKPOINT
from qmailpy.fileio import write_all
from qmailpy.layout import CHANNELS, SPLIT, is_number, relpath


class ConvertError(Exception):
    pass


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _numbers(d):
    try:
        return [int(x) for x in os.listdir(d) if is_number(x)]
    except FileNotFoundError:
        return []


# --- one normal form for both backends --------------------------------------------

def _dir_held(queue, n, path):
    """True when hold/n holds message n (its marker names the birth: dir/holds.py)."""
    try:
        with open(os.path.join(queue, HOLD_DIR, str(n)), "rb") as f:
            marked = f.read(32)
    except FileNotFoundError:
        return False
    return marked == b"%d\n" % int(os.stat(path).st_mtime)


def dir_messages(queue):
    """{n: (state, sender, {channel: [(done, addr)]}, notes, extra)} of a directory queue;
    extra is (uid, pid) in S4 and whether the message is held (qmailctl queue hold) in S5."""
    out = {}
    for n in _numbers(os.path.join(queue, "todo")):
        todo = envelope.parse_todo(_read(os.path.join(queue, "todo", str(n))))
        out[n] = (states.S4, todo.sender, {"todo": [(False, r) for r in todo.recipients]}, b"",
                  (todo.uid, todo.pid))
    for s in range(SPLIT):
        for n in _numbers(os.path.join(queue, "info", str(s))):
            if n in out:
                continue                            # todo wins: preprocessing is redone
            path = os.path.join(queue, relpath("info", n))
            sender = envelope.parse_info(_read(path))
            chans = {}
            for c in CHANNELS:
                try:
                    data = _read(os.path.join(queue, relpath(c, n)))
                except FileNotFoundError:
                    continue
                chans[c] = [(r.done, r.address) for r in envelope.parse_channel(data)]
            try:
                notes = _read(os.path.join(queue, "bounce", str(n)))
            except FileNotFoundError:
                notes = b""
            out[n] = (states.S5, sender, chans, notes, _dir_held(queue, n, path))
    return out


def log_messages(lq):
    out = {}
    for n, m in lq.latest_states().items():
        rec = m["rec"]
        if m["state"] == states.S4:
            out[n] = (states.S4, rec.sender, {"todo": [(False, r) for r in rec.recipients]}, b"",
                      (rec.uid, rec.qp))
            continue
        chans = {}
        for c, (_, rcpts) in rec.channels.items():
            chans[c] = [(done or (c, i) in m["done"], a) for i, (done, a) in enumerate(rcpts)]
        out[n] = (states.S5, rec.sender, chans, m["notes"], bool(rec.held))
    return out


def _same(a, b):
    """Messages of a that are missing or different in b (by number)."""
    return sorted(n for n in a if a[n][:4] != (b.get(n) or (None,))[:4]
                  or (a[n][0] == states.S5 and a[n][4] != b[n][4]))


# --- progress ----------------------------------------------------------------------

class Progress:
    def __init__(self, total, label, stream, width=30):
        self.total, self.label, self.stream, self.width = total, label, stream, width
        self.done = 0

    def step(self, k=1):
        self.done += k
        if self.stream is None:
            return
        if self.done == self.total or self.done % 97 == 0:
            frac = self.done / self.total if self.total else 1
            bar = "#" * int(frac * self.width)
            self.stream.write("\r%s [%-*s] %d/%d" % (self.label, self.width, bar, self.done, self.total))
            self.stream.flush()

    def end(self):
        if self.stream is not None:
            if not self.total:
                self.stream.write("%s: nothing to do" % self.label)
            self.stream.write("\n")
            self.stream.flush()


# --- dir -> log ---------------------------------------------------------------------

HOLD_DIR = "hold"                     # qmailctl queue hold's markers on the dir backend
ENVELOPE_DIRS = ("todo", "intd", "bounce") + tuple(
    "%s/%d" % (kind, s) for kind in ("info",) + CHANNELS for s in range(SPLIT))


def _no_step(name):
    pass


def dir_to_log(home, progress=None, step=_no_step):
    queue = os.path.join(home, "queue")
    source = dir_messages(queue)
    bar = Progress(len(source), "converting to log", progress)
    writer = LogWriter(os.path.join(queue, LOG_DIR))
    try:
        for i, n in enumerate(sorted(source)):
            if i == len(source) // 2:
                writer.sync_all()
                step("target-half")
            state, sender, chans, notes, extra = source[n]
            if state == states.S4:
                uid, pid = extra
                mtime = int(os.stat(os.path.join(queue, "todo", str(n))).st_mtime)
                writer.append(R.encode_envelope(mtime, n, uid, pid, sender,
                                                [a for _, a in chans["todo"]]))
            else:
                birth = int(os.stat(os.path.join(queue, relpath("info", n))).st_mtime)
                size = _size(queue, n)
                channels = {}
                for c, rcpts in chans.items():
                    due = int(os.stat(os.path.join(queue, relpath(c, n))).st_mtime)
                    channels[c] = (due, rcpts)
                writer.append(R.encode_snapshot(R.PREPROCESSED, birth, n, R.NOWHERE, birth, 0, 0, size,
                                                sender, notes, (), channels, held=extra))
            bar.step()
        writer.sync_all()
    finally:
        writer.close()
        bar.end()
    lq = LogQueue(home)
    lq.recover()                      # counts, runner positions, a checkpoint
    _own_as_layout(home, "queue/" + LOG_DIR)
    target = log_messages(lq)
    lq.close()
    bad = _same(source, target)
    if bad:
        raise ConvertError("verification failed for %d messages (first: %d); the directory queue is untouched"
                           % (len(bad), bad[0]))
    return len(source)


def remove_dir(queue, step=_no_step):
    """Remove every envelope-side file of the directory backend (not mess/ or pid/)."""
    for i, d in enumerate(ENVELOPE_DIRS):
        path = os.path.join(queue, d)
        for n in _numbers(path):
            os.unlink(os.path.join(path, str(n)))
        fsync_dir(path)
        if i == len(ENVELOPE_DIRS) // 2:
            step("source-half")
    hold = os.path.join(queue, HOLD_DIR)
    names = _numbers(hold)
    for n in names:
        os.unlink(os.path.join(hold, str(n)))
    if names:
        fsync_dir(hold)


def remove_log(queue, step=_no_step):
    """Remove the log backend's segments, checkpoint, counts and commit word."""
    logdir = os.path.join(queue, LOG_DIR)
    segments = list_segments(logdir)
    for i, seg in enumerate(segments):
        os.unlink(os.path.join(logdir, segment_name(seg)))
        if i == len(segments) // 2:
            step("source-half")
    for name in (CHECKPOINT, COUNTS, "commit"):
        try:
            os.unlink(os.path.join(logdir, name))
        except FileNotFoundError:
            pass
    if os.path.isdir(logdir):
        fsync_dir(logdir)


def _size(queue, n):
    try:
        return os.stat(os.path.join(queue, relpath("mess", n))).st_size
    except OSError:
        return 0


# --- log -> dir ---------------------------------------------------------------------

class _Dirs:
    """Descriptors of the queue's directories, each opened once by qmailpy.nofollow (as
    root from / with O_NOFOLLOW): queue/ and everything in it belong to qmailq and qmails,
    whose symlink at a name root wrote by path had root truncate and chown the linked file."""

    def __init__(self, home):
        self.home, self.fds = home, {}

    def fd(self, rel):
        if rel not in self.fds:
            self.fds[rel] = nofollow.open_path(self.home, os.path.join("queue", rel))
        return self.fds[rel]

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _chown_tree(dfd, uid, gid):
    """Give every directory and file below the open directory dfd uid and gid, each
    through its own descriptor: a symlink, FIFO or linked file there is Refused."""
    for name in os.listdir(dfd):
        if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
            fd = nofollow.open_dir(name, dfd)
            try:
                _chown_tree(fd, uid, gid)
                os.fchown(fd, uid, gid)
            finally:
                os.close(fd)
        else:
            fd = nofollow.open_file(name, dfd)
            try:
                os.fchown(fd, uid, gid)
            finally:
                os.close(fd)


def _own_as_layout(home, rel):
    """Run as root: give rel, and everything under it, the owner and group layout.conf
    gives rel (queue/log: qmailq and qmaillog, which qmail-send's qmails holds and
    qmail-rspawn's qmailr does not), and rel its mode again (chown clears setgid)."""
    if os.geteuid() != 0:
        return
    from qmailpy import hierarchy
    (entry,) = [e for e in hierarchy.load_layout() if e.path == rel]
    owners = hierarchy.Owners(home)
    uid, gid = owners.uid(entry.owner), owners.gid(entry.group)
    top = nofollow.open_path(home, rel)
    try:
        _chown_tree(top, uid, gid)
        os.fchown(top, uid, gid)
        os.fchmod(top, entry.mode)
    finally:
        os.close(top)


def _write_file(dirs, rel, name, data, mtime=None, mode=0o600):
    """queue/rel/name holds data, owned (as root) like queue/rel; opened through the
    directory's descriptor by nofollow.open_file, which refuses a symlink, FIFO or
    linked file before O_TRUNC cuts anything."""
    dfd = dirs.fd(rel)
    fd = nofollow.open_file(name, dfd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=mode)
    try:
        write_all(fd, data)
        os.fsync(fd)
        if os.geteuid() == 0:
            st = os.fstat(dfd)
            os.fchown(fd, st.st_uid, st.st_gid)
        if mtime is not None:
            os.utime(fd, (mtime, mtime))
    finally:
        os.close(fd)


def _make_hold_dir(dirs):
    """queue/hold/ for a home older than it, owned (as root) like queue/bounce/."""
    try:
        os.mkdir(HOLD_DIR, 0o700, dir_fd=dirs.fd("."))
    except FileExistsError:
        return
    if os.geteuid() == 0:
        st = os.fstat(dirs.fd("bounce"))
        os.fchown(dirs.fd(HOLD_DIR), st.st_uid, st.st_gid)


def log_to_dir(home, progress=None, step=_no_step):
    queue = os.path.join(home, "queue")
    lq = LogQueue(home)
    lq.recover()                      # reconciles half-finished passes first
    latest = lq.latest_states()
    source = log_messages(lq)
    held = False
    dirs = _Dirs(home)
    bar = Progress(len(latest), "converting to dir", progress)
    try:
        for i, n in enumerate(sorted(latest)):
            if i == len(latest) // 2:
                step("target-half")
            m = latest[n]
            rec = m["rec"]
            if m["state"] == states.S4:
                data = envelope.todo_bytes(rec.uid, rec.qp, rec.sender, rec.recipients)
                _write_file(dirs, "intd", str(n), data, rec.time, mode=0o644)
                os.link(str(n), str(n), src_dir_fd=dirs.fd("intd"), dst_dir_fd=dirs.fd("todo"),
                        follow_symlinks=False)
            else:
                for c, (due, _) in rec.channels.items():
                    recs = source[n][2][c]
                    _write_file(dirs, os.path.dirname(relpath(c, n)), str(n),
                                b"".join((b"D" if d else b"T") + a + b"\0" for d, a in recs), due)
                if m["notes"]:
                    _write_file(dirs, "bounce", str(n), m["notes"])
                _write_file(dirs, os.path.dirname(relpath("info", n)), str(n),
                            envelope.info_bytes(rec.sender), rec.birth)
                if rec.held:
                    if not held:
                        _make_hold_dir(dirs)
                    _write_file(dirs, HOLD_DIR, str(n), b"%d\n" % rec.birth)
                    held = True
            bar.step()
        for d in ENVELOPE_DIRS + ((HOLD_DIR,) if held else ()):
            os.fsync(dirs.fd(d))
    finally:
        dirs.close()
        bar.end()
    target = dir_messages(queue)
    bad = _same(source, target)
    if bad:
        lq.close()
        raise ConvertError("verification failed for %d messages (first: %d); the log is untouched"
                           % (len(bad), bad[0]))
    lq.close()
    return len(source)
