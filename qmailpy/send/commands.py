"""qmail-send's commands (docs/qmail-send.md "Commands"): qmailctl queue delete | hold |
release | requeue | bounce, read from queue/command/ (qmailpy/command.py) and answered there.

qmail-send looks at the directory when the trigger is pulled and at startup. A
command is carried out in steps between qmail-send's other work, so a command naming
a great many messages never stops deliveries for long, nor grows qmail-send: its
numbers are an array, the backend locates them (the log backend by walking the log,
WALK_STEP records a turn), then a batch of them is acted on a turn (numbers of one split
directory, sized to take about TURN seconds, MIN_BATCH to ACT_BATCH messages), the batch
is committed (one fsync) and its answers are appended to the reply being written.

A message none of whose deliveries is in flight is acted on at once. Otherwise
qmail-send starts no more deliveries of it, waits for those in flight to finish, and
only then acts and answers: so nothing is delivered after a delete is answered. A
message still in todo is acted on once it is preprocessed.

Each action is logged as one line per message (logline.command_msg, bounce_now), once
it is durable.
"""
import heapq
import os
import stat
import time

from qmailpy import command, logline
from qmailpy.backends.base import QueueError
from qmailpy.layout import SPLIT
from qmailpy.send.clean import CleanerLost

COMMAND_BATCH = 64          # command files read per loop iteration
ACT_BATCH = 200             # messages acted on per loop iteration at most, then one commit
MIN_BATCH = 32              # and at least (a batch's commit is one sync however small it is)
TURN = 0.1                  # seconds a batch should take: the next batch is sized to it
TODO_TRIES = 3              # todo scans to wait for before a queued message is answered
STALE_REPLY = 86400         # seconds; an older unread answer is removed at startup


class Open:
    """A command being carried out: where its numbers (ascending) stand."""
    __slots__ = ("name", "command", "locator", "split", "next", "answered", "reply", "broken", "todo",
                 "tries")

    def __init__(self, name, cmd, directory):
        self.name, self.command = name, cmd
        self.locator = None
        self.split, self.next = 0, 0             # numbers of splits before split are started, and
                                                 # of this split those before index next
        self.answered = 0
        self.reply = command.ReplyWriter(directory, name)
        self.broken = None                       # OSError writing the reply
        self.todo = set()                        # numbers still in todo
        self.tries = 0                           # todo scans waited for


class CommandDesk:
    def __init__(self, send):
        self.send = send
        self.dir = command.COMMAND_DIR           # relative: qmail-send runs in queue/
        self.rescan = True                       # startup: also commands a crash left claimed
        self.startup = True                      # until the first scan has seen every name
        self.resumed = set()                     # claimed commands read during the startup scans
        self.ops = []                            # Opens with numbers not yet started
        self.waiting = {}                        # n -> [Open] until n's deliveries end
        self.quiesce = set()                     # numbers whose passes start no delivery
        self.todo_wait = []                      # Opens whose messages were still in todo
        self.batch = MIN_BATCH                   # messages in the next batch

    def wakeup(self, now):
        busy = self.rescan or self.ops or (self.todo_wait and self.send.todo is None)
        return now if busy else None

    # -- reading the directory -------------------------------------------------
    def do(self, pulled):
        if pulled:
            self.rescan = True
        if self.todo_wait and self.send.todo is None:
            ops, self.todo_wait = self.todo_wait, []
            for op in ops:
                numbers, op.todo = sorted(op.todo), set()
                self._start(op, numbers)
        if self.rescan:
            self._scan()
        self._step()

    def _scan(self):
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
                return                           # (still startup: the next scan resumes the rest)
            if self.startup and (name.startswith(".") or name.endswith(command.REPLY)):
                self._drop_stale(name)
                continue
            if name.startswith(".") or name.endswith(command.REPLY):
                continue
            if name.endswith(command.WORK):
                base = name[:-len(command.WORK)]
                if self.startup and "." not in base and base not in self.resumed:
                    taken += 1
                    self.resumed.add(base)
                    self._resume(base, names)
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
            if self.startup:
                self.resumed.add(name)           # claimed now: not one to take up again
            self._read(name)
        self.startup = False
        self.resumed = set()

    def _drop_stale(self, name):
        """An answer nobody read for a day (its qmailctl was killed), or a file being
        written that a crash left."""
        path = os.path.join(self.dir, name)
        try:
            if os.lstat(path).st_mtime < time.time() - STALE_REPLY:
                os.unlink(path)
        except OSError:
            pass

    def _resume(self, name, names):
        """A command claimed before a crash: answered already if its reply is there."""
        if name + command.REPLY in names:
            try:
                os.unlink(self._work(name))
            except OSError:
                pass
            return
        self._read(name)

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
                cmd = command.read(f)
        except OSError as e:
            self._garbage(name + command.WORK, "unable to read: %s" % e.strerror)
            return
        except command.CommandError as e:
            self._garbage(name + command.WORK, str(e))
            return
        finally:
            os.close(fd)
        op = Open(name, cmd, self.dir)
        if not cmd.numbers:
            self._answer(op)
            return
        op.locator = self.send.backend.locate(cmd.numbers)
        self.ops.append(op)

    # -- carrying out -----------------------------------------------------------
    def _step(self):
        """One step of the oldest command: a step of its locator's walk, or a batch."""
        if not self.ops:
            return
        op = self.ops[0]
        if not op.locator.step():
            return
        batch = self._next_batch(op)
        if op.split >= SPLIT:
            self.ops.pop(0)
        started = time.monotonic()
        self._start(op, batch)
        spent = max(time.monotonic() - started, 0.001)
        self.batch = max(MIN_BATCH, min(ACT_BATCH, int(len(batch) * TURN / spent)))

    def _next_batch(self, op):
        """Up to self.batch of op's numbers not yet started, all of one split (n % SPLIT),
        taken split by split: the directory backend's commit() then syncs one directory
        per channel for the batch, however the numbers fall."""
        numbers, size = op.command.numbers, self.batch
        batch = []
        while op.split < SPLIT:
            end = len(numbers)
            while op.next < end and len(batch) < size:
                n = numbers[op.next]
                op.next += 1
                if n % SPLIT == op.split:
                    batch.append(n)
            if len(batch) >= size and op.next < end:
                return batch
            op.split, op.next = op.split + 1, 0
            if batch:
                return batch
        return batch

    def _start(self, op, numbers):
        """Act on the numbers of op that are idle; the others wait for their deliveries."""
        idle = []
        for n in numbers:
            if self._busy(n):
                self.quiesce.add(n)
                self.waiting.setdefault(n, []).append(op)
            else:
                idle.append(n)
        if idle:
            self._act(op, idle)

    def _act(self, op, numbers):
        backend = self.send.backend
        self._give_back(numbers)
        answers = []                             # (n, result, text, lines to log)
        try:
            preprocessed, queued = backend.take(numbers, op.locator)
        except QueueError as e:
            self.send.warn(str(e))
            preprocessed, queued = (), ()
            answers = [(n, command.LATER, "queue error; try again", ()) for n in numbers]
            numbers = ()
        preprocessed, queued = set(preprocessed), set(queued)
        for n in numbers:
            if n in preprocessed:
                if not self._bring(n):
                    answers.append((n, command.NONE, "not in queue", ()))
                    continue
                answers.append((n,) + self._carry_out(op.command, n))
                backend.let_go(n)
            elif n in queued and (backend.is_set_aside(n) or op.command.action == "delete"
                                  and op.tries >= TODO_TRIES):
                # one that preprocessing set aside, or still fails after TODO_TRIES scans
                answers.append((n,) + self._carry_out_queued(op.command, n))
            elif n in queued and op.tries < TODO_TRIES:
                op.todo.add(n)                   # answered after a todo scan
            elif n in queued:
                answers.append((n, command.LATER, "not yet preprocessed; try again", ()))
            else:
                answers.append((n, command.NONE, "not in queue", ()))
        if op.todo and op not in self.todo_wait:
            op.tries += 1
            self.todo_wait.append(op)
            self.send.nexttodorun = self.send.now
        self._commit(answers)
        for n, result, text, _ in answers:
            self._record(op, n, result, text)

    def _commit(self, answers):
        """The batch's actions durable, then their log lines; if the sync fails, their
        answers are 'later' (qmailctl exits 111 and may ask again)."""
        if not any(lines for _, _, _, lines in answers):
            return
        try:
            self.send.backend.commit()
        except (QueueError, CleanerLost) as e:
            if isinstance(e, CleanerLost):
                self.send.cleandied()
                why = "qmail-clean lost"
            else:
                self.send.warn(str(e))
                why = "queue error: %s" % e
            answers[:] = [(n, command.LATER, why, ()) if lines else (n, r, t, lines)
                          for n, r, t, lines in answers]
            return
        for _, _, _, lines in answers:
            for line in lines:
                self.send.log(line)

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

    def _carry_out_queued(self, cmd, n):
        """A message that preprocessing set aside (docs/qmail-send.md "Messages set aside")
        or that fails it scan after scan: it can only be deleted."""
        if cmd.action != "delete":
            return command.NONE, "set aside (see the log): only delete acts on it", ()
        try:
            self.send.backend.delete_queued(n)
        except QueueError as e:
            self.send.warn(str(e))
            return command.LATER, "queue error; try again", ()
        return command.DONE, "deleted", (logline.command_msg("delete", n),)

    def _carry_out(self, cmd, n):
        """(result, text, lines to log once committed) of one action on an idle, taken message n."""
        backend, send = self.send.backend, self.send
        action = cmd.action
        try:
            held = backend.is_held(n)
            if action == "delete":
                backend.delete(n)
                return command.DONE, "deleted", (logline.command_msg("delete", n),)
            if action == "release" and not held:
                return command.NONE, "not held", ()
            if action == "hold" and held:
                return command.NONE, "already held", ()
            if not backend.channels_left(n):
                return command.NONE, "nothing left to deliver", ()
            if action == "hold":
                backend.hold(n)
                return command.DONE, "held", (logline.command_msg("hold", n),)
            lines = ()
            if held:
                backend.release(n)
                lines = (logline.command_msg("release", n),)
                if action == "release":
                    return command.DONE, "released", lines
            if action == "requeue":
                backend.requeue(n, int(time.time()))
                return command.DONE, "requeued", lines + (logline.command_msg("requeue", n),)
            if lines:                            # the release is logged before the bounce's lines
                backend.commit()
                send.log(lines[0])
            return self._bounce(n, cmd.reason) + ((),)
        except QueueError as e:
            send.warn(str(e))
            return command.LATER, "queue error: %s" % e, ()
        except CleanerLost:
            send.cleandied()
            return command.LATER, "qmail-clean lost", ()

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

    def _record(self, op, n, result, text):
        op.answered += 1
        if op.broken is None:
            try:
                op.reply.add(n, result, text)
            except OSError as e:
                op.broken = e
        if op.answered == len(op.command.numbers):
            self._answer(op)

    def _answer(self, op):
        if op.locator is not None:
            self.send.backend.forget(op.locator)
        try:
            if op.broken is not None:
                raise op.broken
            op.reply.finish()
            os.unlink(self._work(op.name))
        except OSError as e:
            self.send.warn("unable to answer %s/%s: %s" % (self.dir, op.name, e.strerror))
