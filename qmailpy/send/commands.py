"""qmail-send's commands (docs/qmail-send.md "Commands"): qmailctl queue delete | hold |
release | requeue | bounce, read from queue/command/ (qmailpy/command.py) and answered there.

qmail-send looks at the directory when the trigger is pulled and at startup. A
command on a message none of whose deliveries is in flight is carried out at once.
Otherwise qmail-send starts no more deliveries of it, waits for those in flight to
finish, and only then acts and answers: so nothing is delivered after a delete is
answered. A message still in todo is acted on once it is preprocessed.

Each action is logged as one line per message (logline.command_msg, bounce_now).
"""
import heapq
import os
import stat
import time

from qmailpy import command, logline
from qmailpy.backends.base import QueueError
from qmailpy.send.clean import CleanerLost

COMMAND_BATCH = 64          # command files read per loop iteration
TODO_TRIES = 3              # todo scans to wait for before a queued message is answered
STALE_REPLY = 86400         # seconds; an older unread answer is removed at startup


class Open:
    """A command being carried out, and where each of its numbers stands."""
    __slots__ = ("name", "command", "results", "todo", "tries")

    def __init__(self, name, cmd):
        self.name, self.command = name, cmd
        self.results = {}                        # n -> (result, text)
        self.todo = set()                        # numbers still in todo
        self.tries = 0                           # todo scans waited for

    def complete(self):
        return len(self.results) == len(set(self.command.numbers))


class CommandDesk:
    def __init__(self, send):
        self.send = send
        self.dir = command.COMMAND_DIR           # relative: qmail-send runs in queue/
        self.rescan = True                       # startup: also commands a crash left claimed
        self.startup = True
        self.waiting = {}                        # n -> [Open] until n's deliveries end
        self.quiesce = set()                     # numbers whose passes start no delivery
        self.todo_wait = []                      # Opens whose messages were still in todo

    def wakeup(self, now):
        return now if self.rescan or (self.todo_wait and self.send.todo is None) else None

    # -- reading the directory -------------------------------------------------
    def do(self, pulled):
        if pulled:
            self.rescan = True
        if self.todo_wait and self.send.todo is None:
            ops, self.todo_wait = self.todo_wait, []
            for op in ops:
                numbers, op.todo = sorted(op.todo), set()
                self._start(op, numbers)
        if not self.rescan:
            return
        self.rescan = False
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            self.startup = False
            return
        taken = 0
        for name in names:
            if taken >= COMMAND_BATCH:
                self.rescan = True
                break
            if name.endswith(command.REPLY) and self.startup:
                self._drop_stale_reply(name)
                continue
            if name.startswith(".") or name.endswith(command.REPLY):
                continue
            if name.endswith(command.WORK):
                if self.startup and "." not in name[:-len(command.WORK)]:
                    taken += 1
                    self._read(name[:-len(command.WORK)])
                continue
            taken += 1
            if "." in name:
                self._garbage(name, "not a command name")
                continue
            try:
                os.rename(os.path.join(self.dir, name), self._work(name))
            except FileNotFoundError:
                continue                         # withdrawn by its author
            except OSError as e:
                self.send.warn("unable to claim %s/%s: %s" % (self.dir, name, e.strerror))
                continue
            self._read(name)
        self.startup = False

    def _drop_stale_reply(self, name):
        """An answer nobody read for a day: its qmailctl was killed."""
        path = os.path.join(self.dir, name)
        try:
            if os.stat(path).st_mtime < time.time() - STALE_REPLY:
                os.unlink(path)
        except OSError:
            pass

    def _work(self, name):
        return os.path.join(self.dir, name + command.WORK)

    def _garbage(self, name, why):
        self.send.warn("%s/%s: %s; ignored" % (self.dir, name, why))
        try:
            os.unlink(os.path.join(self.dir, name))
        except OSError:
            pass

    def _read(self, name):
        # Never a link followed, nor an open or a read that blocks (a FIFO): a regular file only.
        try:
            fd = os.open(self._work(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            self._garbage(name + command.WORK, "unable to read: %s" % e.strerror)
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self._garbage(name + command.WORK, "not a regular file")
                return
            with open(fd, "rb", closefd=False) as f:
                data = f.read(command.MAX_COMMAND + 1)
        except OSError as e:
            self._garbage(name + command.WORK, "unable to read: %s" % e.strerror)
            return
        finally:
            os.close(fd)
        try:
            if len(data) > command.MAX_COMMAND:
                raise command.CommandError("too long")
            cmd = command.decode(data)
        except command.CommandError as e:
            self._garbage(name + command.WORK, str(e))
            return
        op = Open(name, cmd)
        self._start(op, list(dict.fromkeys(cmd.numbers)))

    # -- carrying out -----------------------------------------------------------
    def _start(self, op, numbers):
        """Act on the numbers of op that are idle; the others wait for their deliveries."""
        idle = []
        for n in numbers:
            if self._busy(n):
                self.quiesce.add(n)
                self.waiting.setdefault(n, []).append(op)
            else:
                idle.append(n)
        if idle or op.complete():
            self._act(op, idle)

    def _act(self, op, numbers):
        backend = self.send.backend
        self._give_back(numbers)
        try:
            preprocessed, queued = backend.take(numbers) if numbers else ([], [])
        except QueueError as e:
            self.send.warn(str(e))
            preprocessed, queued = [], []
            for n in numbers:
                op.results[n] = (command.LATER, "queue error; try again")
        preprocessed, queued = set(preprocessed), set(queued)
        for n in numbers:
            if n in op.results:
                continue
            if n in preprocessed:
                if not self._bring(n):
                    op.results[n] = (command.NONE, "not in queue")
                    continue
                op.results[n] = self._carry_out(op.command, n)
                backend.let_go(n)
            elif n in queued and op.tries < TODO_TRIES:
                op.todo.add(n)                   # answered after a todo scan
            elif n in queued:
                op.results[n] = (command.LATER, "not yet preprocessed; try again")
            else:
                op.results[n] = (command.NONE, "not in queue")
        if op.todo and op not in self.todo_wait:
            op.tries += 1
            self.todo_wait.append(op)
            self.send.nexttodorun = self.send.now
        if op.complete():
            self._answer(op)

    def _bring(self, n):
        try:
            return self.send.backend.bring(n)
        except QueueError as e:
            self.send.warn(str(e))
            return False

    def _busy(self, n):
        for ch in self.send.channels:
            if ch.job is not None and ch.job.n == n:
                return True
            if any(dl is not None and dl.job.n == n for dl in ch.slots):
                return True
        return False

    def job_closed(self, n):
        """A pass or delivery of message n ended: act on it if it waited for that."""
        if n not in self.waiting or self._busy(n):
            return
        self.quiesce.discard(n)
        for op in self.waiting.pop(n):
            self._act(op, [n])

    def _give_back(self, numbers):
        """Entries of these messages that qmail-send holds (due passes, the throttle
        gate's) go back to the backend's schedule, so that the backend alone knows where
        each stands. One pass over each channel's heap, however many numbers."""
        send = self.send
        wanted = set(numbers)
        entries = {}
        for ch in send.channels:
            if any(m in wanted for _, m in ch.heap):
                for due, m in ch.heap:
                    if m in wanted:
                        key = (m, ch.name)
                        entries[key] = min(due, entries.get(key, due))
                ch.heap = [(due, m) for due, m in ch.heap if m not in wanted]
                heapq.heapify(ch.heap)
            gate = getattr(send, "gate", None)
            for n in wanted if gate is not None else ():
                parked = gate.take(ch.name, n)
                if parked is not None:
                    parked.woken = True          # its wake-up must not open a pass
                    entries[(n, ch.name)] = parked.retry
        for (n, channel), due in entries.items():
            try:
                send.backend.reschedule(n, channel, due)
            except QueueError as e:
                send.warn(str(e))

    def _carry_out(self, cmd, n):
        """(result, text) of one action on an idle, taken message n."""
        backend, send = self.send.backend, self.send
        action = cmd.action
        try:
            held = backend.is_held(n)
            if action == "delete":
                backend.delete(n)
                send.log(logline.command_msg("delete", n))
                return command.DONE, "deleted"
            if action == "release" and not held:
                return command.NONE, "not held"
            if action == "hold" and held:
                return command.NONE, "already held"
            if not backend.channels_left(n):
                return command.NONE, "nothing left to deliver"
            if action == "hold":
                backend.hold(n)
                send.log(logline.command_msg("hold", n))
                return command.DONE, "held"
            if held:
                backend.release(n)
                send.log(logline.command_msg("release", n))
                if action == "release":
                    return command.DONE, "released"
            if action == "requeue":
                backend.requeue(n, int(time.time()))
                send.log(logline.command_msg("requeue", n))
                return command.DONE, "requeued"
            return self._bounce(n, cmd.reason)
        except QueueError as e:
            send.warn(str(e))
            return command.LATER, "queue error: %s" % e
        except CleanerLost:
            send.cleandied()
            return command.LATER, "qmail-clean lost"

    def _bounce(self, n, reason):
        """Fail every pending recipient with `reason`, through qmail's bounce path."""
        backend, send = self.send.backend, self.send
        text = reason.encode("ascii") + b"\n"
        failed = 0
        for channel in backend.channels_left(n):
            for record in backend.recipients(n, channel):
                if record.done or record.address is None:
                    continue
                send.add_bounce(n, record.address, text)
                backend.mark_done(n, channel, record)
                failed += 1
            backend.finish_channel(n, channel)
        send.log(logline.bounce_now(n, reason))
        heapq.heappush(send.pqdone, (int(time.time()), n))
        return command.DONE, "bounced %d recipient%s" % (failed, "" if failed == 1 else "s")

    def _answer(self, op):
        results = [(n,) + op.results[n] for n in dict.fromkeys(op.command.numbers)]
        try:
            command.write_atomically(self.dir, op.name + command.REPLY, command.encode_reply(results))
            os.unlink(self._work(op.name))
        except OSError as e:
            self.send.warn("unable to answer %s/%s: %s" % (self.dir, op.name, e.strerror))
