"""The qmail-send <-> qmail-lspawn/qmail-rspawn pipe protocol, both ends (docs/protocols.md "qmail-send ↔ spawners").

Command (send -> spawner): {slot byte}{S/n}\\0{sender}\\0{recipient}\\0
Reply   (spawner -> send): {slot byte}{K|Z|D}{text}\\0
Greeting (spawner -> send): one byte, the spawner's slot count.

serve() is the spawner end. By default each delivery runs in a child forked for
it, no exec, so a delivery costs a fork rather than a fresh interpreter; the
parent keeps the write end of each child's output pipe open until the child is
reaped, so EOF on the read end means "child gone and every byte of its output
read". With a pool (qmail-lspawn's delivery workers, qmailpy.local.workerpool)
each delivery is handed to a long-lived worker instead, with the message and the
write end of its output pipe; it is over once the worker has reported its exit
status and every byte of output was read (EOF: the worker and anything it ran
closed the pipe).
"""
import errno
import os
import selectors
import signal
import stat

from qmailpy.fileio import write_all

SLOTS = 120                 # conf-spawn
REPORT_MAX = 10000          # qmail-send keeps at most this much of a reply
OUTPUT_MAX = 65536          # a spawner keeps at most this much child output


# --- qmail-send's end -----------------------------------------------------

def encode_command(slot, messpath, sender, recipient):
    """One delivery command; messpath is relative to queue/mess ("5/457")."""
    return b"".join((bytes((slot,)), messpath, b"\0", sender, b"\0", recipient, b"\0"))


def verp(sender, recipient):
    """VERP expansion (docs/protocols.md "qmail-send ↔ spawners"): 'P@H-@[]' + 'u@d' -> 'Pu=d@H'; otherwise sender unchanged."""
    if not sender.endswith(b"-@[]"):
        return sender
    base = sender[:-4]
    at = base.rfind(b"@")
    rat = recipient.rfind(b"@")
    if at < 0 or rat < 0:
        return sender
    return base[:at] + recipient[:rat] + b"=" + recipient[rat + 1:] + base[at:]


class ReplyReader:
    """Incremental parser of spawner replies: feed(bytes) -> [(slot, letter, text)].

    A NUL ends a reply only after at least one byte (the slot may be 0x00).
    letter is b'K', b'Z', b'D' or something else (a mangled report)."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data):
        replies = []
        buf = self._buf
        pos, size = 0, len(data)
        while pos < size:
            if not buf:                 # the slot: any byte, NUL too
                buf.append(data[pos])
                pos += 1
                continue
            end = data.find(b"\0", pos)
            stop = size if end < 0 else end
            room = REPORT_MAX - len(buf)
            if room > 0:
                buf += data[pos:min(stop, pos + room)]
            if end < 0:
                break
            line = bytes(buf)
            buf.clear()
            replies.append((line[0], line[1:2], line[2:]))
            pos = end + 1
        return replies


# --- the spawner's end ----------------------------------------------------

class Command:
    __slots__ = ("slot", "messid", "sender", "recipient")

    def __init__(self, slot, messid, sender, recipient):
        self.slot, self.messid, self.sender, self.recipient = slot, messid, sender, recipient


class CommandReader:
    """Incremental parser of delivery commands: feed(bytes) -> [Command]."""

    def __init__(self):
        self._slot = None
        self._fields = []
        self._cur = bytearray()

    def feed(self, data):
        commands = []
        pos, size = 0, len(data)
        while pos < size:
            if self._slot is None:
                self._slot = data[pos]
                pos += 1
                continue
            end = data.find(b"\0", pos)
            if end < 0:
                self._cur += data[pos:]
                break
            self._cur += data[pos:end]
            pos = end + 1
            self._fields.append(bytes(self._cur))
            self._cur.clear()
            if len(self._fields) == 3:
                commands.append(Command(self._slot, *self._fields))
                self._slot, self._fields = None, []
        return commands


def encode_reply(slot, report):
    """report = letter + text; cut at its first NUL (a NUL ends the reply)."""
    cut = report.find(b"\0")
    if cut >= 0:
        report = report[:cut]
    return bytes((slot,)) + report + b"\0"


def check_command(cmd, slots, busy, expected_owner):
    """(error report or None, open message fd or None) — qmail's spawner checks in order."""
    if cmd.slot >= slots:
        return b"ZInternal error: delnum too big. (#4.3.5)\n", None
    if cmd.slot in busy:
        return b"ZInternal error: delnum in use. (#4.3.5)\n", None
    for i, ch in enumerate(cmd.messid):
        if (i == 0 or ch != 0x2F) and not 0x30 <= ch <= 0x39:
            return b"DInternal error: messid has nonnumerics. (#5.3.5)\n", None
    if len(cmd.messid) + 1 > 100:
        return b"DInternal error: messid too long. (#5.3.5)\n", None
    if not cmd.messid:
        return b"DInternal error: messid too short. (#5.3.5)\n", None
    if b"@" not in cmd.recipient:
        return b"DSorry, address must include host name. (#5.1.3)\n", None
    try:
        # O_NONBLOCK so a FIFO planted in mess/ cannot hang the spawner.
        fd = os.open(cmd.messid, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b"Zqmail-spawn unable to open message. (#4.3.0)\n", None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return b"Zqmail-spawn unable to fstat message. (#4.3.0)\n", None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return b"ZSorry, message has wrong type. (#4.3.5)\n", None
    if expected_owner is not None and st.st_uid != expected_owner:
        os.close(fd)
        return b"ZSorry, message has wrong owner. (#4.3.5)\n", None
    os.set_blocking(fd, True)
    return None, fd


class _Delivery:
    __slots__ = ("pid", "read_fd", "write_fd", "output", "wstat", "eof")

    def __init__(self, pid, read_fd, write_fd):
        self.pid, self.read_fd, self.write_fd = pid, read_fd, write_fd
        self.output = bytearray()
        self.wstat = None
        self.eof = False


def _run_child(run_delivery, messfd, out_w, cmd):
    """In the forked child: wire fds 0/1/2 and run the delivery; never returns."""
    code = 111
    try:
        # The parent's wakeup fd is about to be closed; a stale number could be
        # reused by the child's own files. SIGPIPE stays ignored, as qmail's
        # spawner children inherit it; program deliveries restore it themselves.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(messfd, 0)
        os.dup2(out_w, 1)
        _keep_stderr(3)
        os.dup2(1, 2)
        # Other deliveries' pipe ends must not leak into this child: a held
        # write end would delay that delivery's EOF until this child exits.
        os.closerange(4, 65536)
        code = run_delivery(cmd.sender, cmd.recipient)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 111
    except BaseException as e:     # a bug in delivery code must still produce a report
        from qmailpy import internalerror
        program = "qmail-spawn child"
        try:
            os.write(2, internalerror.summary(program, e) + b" (#4.3.0)\n")
        except OSError:
            pass
        internalerror.log(program, e, 3)
        code = 111
    finally:
        os._exit(code if isinstance(code, int) else 111)


def _keep_stderr(fd):
    """The spawner's stderr (qmail-send's log) on fd, closed on exec, for a bug's traceback."""
    try:
        os.dup2(2, fd, inheritable=False)
    except OSError:             # no stderr: nothing will be written there
        try:
            os.close(fd)
        except OSError:
            pass


class _Spawner:
    """serve()'s state: the deliveries in progress by slot, the pipes and the selector."""

    def __init__(self, run_delivery, report, slots, expected_owner, infd, outfd, pool):
        self.run_delivery, self.report, self.slots = run_delivery, report, slots
        self.expected_owner, self.infd, self.outfd, self.pool = expected_owner, infd, outfd, pool
        self.deliveries = {}                # slot -> _Delivery
        self.writing = True
        self.reading = True
        self.reader = CommandReader()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        # select(2), not epoll: it also accepts fd 0 on /dev/null or a file (a spawner run
        # by hand), which then reads as qmail-send going away at once.
        self.sel = selectors.SelectSelector()
        self.sel.register(infd, selectors.EVENT_READ, "cmd")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def send(self, data):
        if not self.writing:
            return
        try:
            write_all(self.outfd, data)
        except OSError:
            self.writing = False            # qmail-send is gone; finish deliveries anyway

    def reply(self, slot, report):
        self.send(encode_reply(slot, report))

    def reap(self):
        while True:
            try:
                pid, wstat = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for d in self.deliveries.values():
                if d.pid == pid:
                    d.wstat = wstat
                    os.close(d.write_fd)
                    d.write_fd = -1

    def finish(self, slot):
        d = self.deliveries[slot]
        if not d.eof or d.wstat is None:
            return
        del self.deliveries[slot]
        self.reply(slot, self.report(d.wstat, bytes(d.output)))

    def completed(self, results):
        for slot, wstat, output in results:
            if slot in self.deliveries:
                d = self.deliveries[slot]
                d.wstat = wstat
                if output is not None:
                    d.output = bytearray(output)
                self.finish(slot)

    def start(self, cmd):
        error, messfd = check_command(cmd, self.slots, self.deliveries, self.expected_owner)
        if error is not None:
            self.reply(cmd.slot, error)
            return
        try:
            out_r, out_w = os.pipe()
        except OSError:
            os.close(messfd)
            self.reply(cmd.slot, b"Zqmail-spawn unable to create pipe. (#4.3.0)\n")
            return
        os.set_inheritable(out_r, False)
        if self.pool is not None:
            self.start_in_pool(cmd, messfd, out_r, out_w)
        else:
            self.start_child(cmd, messfd, out_r, out_w)

    def start_in_pool(self, cmd, messfd, out_r, out_w):
        try:
            done = self.pool.start(cmd, messfd, out_w)
        except OSError:
            os.close(out_r)                 # qmail's own reply, as for a failed fork
            self.reply(cmd.slot, b"Zqmail-spawn unable to fork. (#4.3.0)\n")
            return
        if done is not None:
            os.close(out_r)
            self.reply(cmd.slot, self.report(*done))
            return
        self.watch(cmd.slot, _Delivery(None, out_r, -1))

    def start_child(self, cmd, messfd, out_r, out_w):
        try:
            pid = os.fork()
        except OSError:
            for fd in (messfd, out_r, out_w):
                os.close(fd)
            self.reply(cmd.slot, b"Zqmail-spawn unable to fork. (#4.3.0)\n")
            return
        if pid == 0:
            _run_child(self.run_delivery, messfd, out_w, cmd)
        os.close(messfd)
        os.set_inheritable(out_w, False)
        self.watch(cmd.slot, _Delivery(pid, out_r, out_w))

    def watch(self, slot, delivery):
        self.deliveries[slot] = delivery
        self.sel.register(delivery.read_fd, selectors.EVENT_READ, slot)

    def drain_wakeups(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        self.reap()

    def read_commands(self):
        try:
            data = os.read(self.infd, 4096)
        except InterruptedError:
            return
        except OSError as e:
            if e.errno == errno.EAGAIN:
                return
            data = b""
        if not data:
            self.reading = False
            self.sel.unregister(self.infd)
            return
        for cmd in self.reader.feed(data):
            self.start(cmd)
        if self.pool is not None:
            self.completed(self.pool.flush())

    def read_output(self, slot):
        d = self.deliveries[slot]
        try:
            data = os.read(d.read_fd, 4096)
        except InterruptedError:
            return
        if data:
            if len(d.output) < OUTPUT_MAX:
                d.output += data[:OUTPUT_MAX - len(d.output)]
            return
        if d.wstat is None and d.pid is not None:
            # EOF before the child was reaped cannot happen while we hold the
            # write end; reap synchronously to be safe.
            _, d.wstat = os.waitpid(d.pid, 0)
        self.sel.unregister(d.read_fd)
        os.close(d.read_fd)
        d.eof = True
        self.finish(slot)

    def handle(self, tag):
        if isinstance(tag, tuple):          # ("pool", worker): a worker reported
            self.completed(self.pool.readable(tag[1]))
        elif tag == "wake":
            self.drain_wakeups()
        elif tag == "cmd":
            self.read_commands()
        else:
            self.read_output(tag)

    def loop(self):
        pool = self.pool
        while self.reading or self.deliveries:
            try:
                events = self.sel.select(None if pool is None else pool.timeout())
            except InterruptedError:
                events = []
            self.reap()
            for key, _ in events:
                self.handle(key.data)
            if pool is not None:
                pool.tick()
        if pool is not None:
            pool.close()
        signal.set_wakeup_fd(-1)


def serve(run_delivery, report, slots=SLOTS, expected_owner=None, infd=0, outfd=1, pool=None):
    """Run a spawner until its command pipe closes and every delivery has reported.

    run_delivery(sender, recipient) runs in a forked child with the message on
    fd 0 and the report pipe on fds 1 and 2; it returns an exit status (or
    execs). report(wstat, output) -> bytes (letter + text) turns a finished
    child into its reply. The working directory must be queue/mess.

    pool (a qmailpy.workers.Pool): instead of forking, pool.start(cmd, messfd, out_w)
    hands the delivery to a worker, or keeps it for pool.flush() after the batch of
    commands, and returns None, or returns the (wstat, output) of a delivery that
    needed no worker; either way both descriptors are the pool's to close.
    pool.flush() returns [(slot, wstat, output)] for what it could not hand over.
    pool.register(selector) puts its workers' channels in the loop with key data
    ("pool", worker), and pool.readable(worker) returns the [(slot, wstat, output)]
    of deliveries it finished (output None: read from the pipe). pool.timeout() is
    how long the loop may sleep (None: forever) and pool.tick() retires idle workers.
    """
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    spawner = _Spawner(run_delivery, report, slots, expected_owner, infd, outfd, pool)
    spawner.send(bytes((slots,)))
    if pool is not None:
        pool.register(spawner.sel)
    spawner.loop()
    return 0


def truncate_report(output, limit=3000):
    """qmail-lspawn's cut: above limit bytes keep limit-34 and append the 31-byte note."""
    note = b"\nError report too long, sorry.\n"
    if limit > 100 and len(output) > limit:
        return output[:limit - len(note) - 3] + note
    return output
