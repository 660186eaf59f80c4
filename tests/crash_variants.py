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
