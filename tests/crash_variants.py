"""Known-bad variants of qmailpy for the crash-state explorer (tests/test_crash_states.py).

A dimension of the explorer is only worth its cost if it catches the defect it was
added for. install(home, program, name) makes the home's launcher of `program` apply
the variant `name` (a function below) before the program runs; the rest of the code is
the real one. Each variant is a defect qmailpy once had or could have.
"""
import os

TESTS = os.path.dirname(os.path.abspath(__file__))


def install(home, program, name):
    path = os.path.join(home.path, "bin", program)
    with open(path) as f:
        lines = f.read().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("sys.path.extend("))
    lines[at + 1:at + 1] = ["sys.path.insert(0, %r)" % TESTS, "import crash_variants",
                            "crash_variants.%s()" % name]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def unlink_before_checkpoint():
    """Issue 29's order: a checkpoint removes finished bodies and all-garbage segments,
    then writes the checkpoint file that no longer needs them."""
    from qmailpy.backends.log.recovery import Recovery
    write = Recovery._write_checkpoint

    def early(self, replay, cleaning=()):
        for n in cleaning:
            self.garbage.clean(n)
        del cleaning[:]                      # removed: the checkpoint no longer names them
        self.garbage.delete_garbage_segments(replay)
        write(self, replay, cleaning)
    Recovery._write_checkpoint = early


def log_dir_unsynced():
    """queue/log made by mkdir without an fsync of queue/."""
    from qmailpy.backends.log.commit import LogWriter
    init = LogWriter.__init__

    def unsynced(self, logdir, segment_limit=None):
        try:
            os.mkdir(logdir)
            os.chmod(logdir, 0o2770)
        except FileExistsError:
            pass
        init(self, logdir, segment_limit)
    LogWriter.__init__ = unsynced


def not_before_after_fsync():
    """qmail-queue setting a not-before time (the mess file's mtime) after the fsync that
    its exit 0 relies on."""
    from qmailpy import mess
    from qmailpy.backends.log import enqueue as logenqueue
    from qmailpy.queue import qmailqueue
    fill = mess.fill_mess

    def late(fd, messdir, first, read, not_before=None, *args, **kw):
        done = fill(fd, messdir, first, read, None, *args, **kw)
        if not_before is not None:
            os.utime(fd, ns=(os.fstat(fd).st_atime_ns, not_before * 10 ** 9))
        return done
    qmailqueue.fill_mess = logenqueue.fill_mess = late


def short_header_read():
    """The log's readers taking a record header (12 bytes) at a position without checking
    that 12 bytes remain: a torn append that left fewer (a power cut at a sector boundary
    just past the append's start) raises struct.error where the real code finds the
    log's end. Only a tear at a sector boundary leaves so little: a cut at half of an
    append leaves its whole header."""
    from qmailpy.backends.log import records
    header = records.RECORD_HEADER

    def frame_length(data, pos=0):
        magic, type, flags, length, crc = header.unpack_from(data, pos)
        if magic != records.RECORD_MAGIC or length > records.MAX_PAYLOAD:
            return None
        end = pos + records.RECORD_HEADER_SIZE + length
        if end > len(data):
            return None
        payload = data[pos + records.RECORD_HEADER_SIZE:end]
        if records.crc32c(payload, records.crc32c(data[pos:pos + 3] + data[pos + 4:pos + 8])) != crc:
            return None
        return end - pos
    records.frame_length = frame_length


def corrupt_read_as_torn_end():
    """Recovery reading the first record that fails its checksum as the torn end of the
    log, without looking for a good record after it (the appender's valid_end does
    look): the head is cut there, and records after the bad one are lost, the ones
    appended after the crash by qmail-queue included. A bad record with good ones after
    it is an earlier write torn while later ones were kept (or a hole among appends)."""
    from qmailpy.backends.log import records

    def decode(data, segment, start=records.HEADER_SIZE, final=True):
        found, problems, pos = [], [], start
        while pos < len(data):
            record = records.decode_one(data, pos)
            if record is None:
                problems.append(records.Problem(records.TORN, segment, pos, len(data)))
                break
            record.pos = (segment, pos)
            found.append(record)
            pos += record.length
        return found, problems, pos
    records.decode = decode


def pid_name_means_unfinished():
    """qmail-send (directory backend) taking a message whose body is still linked from
    pid/ and whose intd/n is gone for one whose qmail-queue never reached S3, and leaving
    it to the 36-hour cleanup. Neither the pid/ name's unlink nor intd/n's creation is
    ever made durable (todo/n and mess/S/n are): losing either alone misleads nothing
    here, losing both does."""
    from qmailpy.backends.dir.queue import DirQueue
    from qmailpy.layout import SPLIT
    new_work = DirQueue.new_work

    def unfinished(n, queue):
        try:
            linked = os.stat(os.path.join(queue, "mess", str(n % SPLIT), str(n))).st_nlink > 1
        except FileNotFoundError:
            return False
        return linked and not os.path.exists(os.path.join(queue, "intd", str(n)))

    def finished_only(self):
        return [n for n in new_work(self) if not unfinished(n, self.queue)]
    DirQueue.new_work = finished_only


def leftovers_inherited():
    """Directory backend preprocessing as qmail's: channel files of an earlier message
    with the same number are removed only when info/S/n is there too. A power cut may
    keep info's unlink and lose a channel file's; a new message on the freed inode
    then meets the old channel file (its O_EXCL create fails, every pass)."""
    from qmailpy.backends.dir import preprocess
    from qmailpy.backends.dir.state import rel

    def create_info(self, n, info_rel):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(self.state.path(info_rel), flags, 0o600)
        except FileExistsError:
            for kind in ("local", "remote", "info"):
                self.state.unlink_quietly(rel(kind, n))
            return os.open(self.state.path(info_rel), flags, 0o600)
    preprocess.DirPreprocessor._create_info = create_info


def bodiless_todo_kept_while_info_is_there():
    """qmail-send (directory backend) removing a todo/n whose body is gone only when the
    message has no info/S/n; with info/ there it takes the preprocessing for interrupted
    and tries again later, for good. A power cut that keeps qmail-clean's unsynced removal
    of the body and loses the earlier removals of todo/n and info/S/n leaves that; losing
    either of those alone, or all of them, does not. The completion's directory syncs
    (DirState.sync_unsynced) are taken away too, as they were before 6247bba: since then
    the body's removal is never kept without those removals, whatever the code does with
    a bodiless todo/n."""
    from qmailpy.backends.base import QueueError
    from qmailpy.backends.dir import preprocess, state
    from qmailpy.backends.dir.state import rel
    drop = preprocess.DirPreprocessor._drop_ended_todo
    state.DirState.sync_unsynced = lambda self: self.unsynced.clear()

    def unless_info(self, n, mess_rel):
        if self.state.exists(rel("info", n)):
            raise QueueError("unable to open %s; will try again later" % mess_rel)
        return drop(self, n, mess_rel)
    preprocess.DirPreprocessor._drop_ended_todo = unless_info
