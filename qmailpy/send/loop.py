"""qmail-send's main loop (docs/qmail-send.md "qmail-send"): todo scans, passes, deliveries, completion.

The loop follows qmail-send's own structure: every iteration computes the
earliest time something is due, selects on the trigger, the spawners' reply
pipes, the command pipes (when a command waits) and a signal pipe, and then
does a little of each kind of work. Log lines are written to fd 0 through
qmailpy.logline, one os.write per line.

The queue backend owns the schedule (backends/base.py): each iteration qmail-send
takes the entries due() hands out into its channels' heaps and pqdone, wakes by
next_wakeup(), and hands a deferred channel back with reschedule(). Its own heaps
hold only work that is due, plus its short retries after an error.
"""
import errno
import fcntl
import heapq
import os
import select
import signal
import time

from qmailpy import logline, retry, trigger
from qmailpy.backends.base import SLEEP_SYSFAIL, QueueError, SetAside
from qmailpy.send.clean import CleanClient, CleanerLost
from qmailpy.envelope import bounce_note
from qmailpy.queuelimits import bounce_text
from qmailpy.send import bounce, metrics
from qmailpy.send.channel import Channel, Delivery, Job
from qmailpy.send.commands import CommandDesk
from qmailpy.send.throttle import Gate
from qmailpy.spawn import encode_command, verp

SLEEP_TODO = 1500
SLEEP_FUZZ = 1
SLEEP_FOREVER = 86400
SLEEP_CLEANUP = 76431
SLEEP_PAUSE = 10
TODO_BATCH = 4          # todo entries preprocessed per loop iteration
_DISCARDED = object()   # _queue_bounce(): refused for good, not to be retried
DYING_TEXT = b"I'm not going to try again; this message has been in the queue too long.\n"
CHANNEL_FDS = (("local", 1, 2), ("remote", 3, 4))
EXIT_LOST_HELPER = 111  # qmail's exits 0; a failure status lets systemd or supervise restart it


class StartError(Exception):
    """qmail-send cannot start; str() is the alert text after 'cannot start: '."""


class QmailSend:
    def __init__(self, home, log_fd=0, clean_fds=(5, 6), channel_fds=CHANNEL_FDS):
        self.home = os.path.abspath(home)
        self.log_fd = log_fd
        self.clean_fds = clean_fds
        self.channel_fds = channel_fds
        self.exitasap = self.runasap = self.readasap = False
        self.next_delid = 1
        self.pqdone = []             # (due, n): completion
        self.todo = None             # numbers left in the current todo scan
        self.cleanup = None          # generator of stale messages during a cleanup walk
        self.cleaner_lost = False
        self.helper_lost = False     # exit 111, so a supervisor restarts the whole set

    # -- logging ---------------------------------------------------------------
    def log(self, line):
        try:
            os.write(self.log_fd, line)
        except OSError:
            pass

    def warn(self, text):
        self.log(logline.warning(text))

    def status(self):
        local, remote = self.channels
        self.log(logline.status(local.used, local.concurrency, remote.used, remote.concurrency,
                                self.exitasap))

    # -- startup ----------------------------------------------------------------
    def start(self):
        """Everything before the loop (docs/qmail-send.md "Startup"); StartError on failure."""
        from qmailpy.home import ControlError
        from qmailpy.send.controls import SendControls
        try:
            os.chdir(self.home)
        except OSError:
            raise StartError("unable to switch to home directory")
        try:
            self.controls = SendControls(self.home)
            from qmailpy.backends import backend_name
            backend_name(self.home)
        except (ControlError, ValueError):
            raise StartError("unable to read controls")
        try:
            os.chdir("queue")
        except OSError:
            raise StartError("unable to switch to queue directory")
        self._signals()
        os.umask(0o077)
        try:
            self.mutex = os.open("lock/sendmutex", os.O_WRONLY)
        except OSError:
            raise StartError("unable to open mutex")
        try:
            fcntl.flock(self.mutex, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StartError("qmail-send is already running")
        self.channels = []
        for name, cmd_fd, reply_fd in self.channel_fds:
            while True:
                try:
                    greeting = os.read(reply_fd, 1)
                    break
                except InterruptedError:
                    continue
                except OSError:
                    greeting = b""
                    break
            if not greeting:
                raise StartError("hath the daemon spawn no fire?")
            concurrency = min(self.controls.concurrency[name], greeting[0])
            self.channels.append(Channel(name, cmd_fd, reply_fd, concurrency))
        self.numjobs = sum(c.concurrency for c in self.channels)
        self.jobs_open = 0
        for ch in self.channels:
            try:
                os.set_blocking(ch.cmd_fd, False)
            except OSError:
                self.spawndied(ch)
        from qmailpy.backends import open_backend
        self.cleaner = CleanClient(*self.clean_fds)
        self.backend = open_backend(self.home, cleaner=self.cleaner, log=self.log)
        self.by_name = {c.name: c for c in self.channels}
        self.gate = Gate(self.controls.rules, self.log)
        self._rule_warnings()
        for entry in self.backend.startup():
            self._add_scheduled(entry)
        self.status()
        self.now = int(time.time())
        self.nexttodorun = self.now
        self.trigger_fd = self._open_trigger(None)
        self.cleanuptime = self.now
        self.metrics = metrics.MetricsFile.of(self.home)
        self.desk = CommandDesk(self)

    def _add_scheduled(self, entry):
        if entry.channel is None:
            heapq.heappush(self.pqdone, (entry.due, entry.n))
        else:
            self.by_name[entry.channel].schedule(entry.due, entry.n)

    def _signals(self):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

        def term(signum, frame):
            self.exitasap = True

        def alrm(signum, frame):
            self.runasap = True

        def hup(signum, frame):
            self.readasap = True
        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGALRM, alrm)
        signal.signal(signal.SIGHUP, hup)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    def _open_trigger(self, fd):
        try:
            return trigger.reopen_reader(os.getcwd(), fd)
        except OSError:
            return None

    # -- the loop ---------------------------------------------------------------
    def run(self):
        """Run until SIGTERM (exit code 0) or a lost helper (EXIT_LOST_HELPER)."""
        while not self.exitasap or not self.can_exit():
            self.now = now = int(time.time())
            self._asap_do(now)
            rfds, wfds = self._select_sets()
            wakeup = self._wakeup(now)
            if not self.exitasap and self.trigger_fd is not None:
                rfds.append(self.trigger_fd)
            try:
                readable, writable, _ = select.select(rfds, wfds, [], self._timeout(now, wakeup))
            except InterruptedError:
                continue
            except (OSError, ValueError):
                self.warn("trouble in select")
                continue
            self.now = int(time.time())
            self._work(readable, writable)
        self.finish()
        return EXIT_LOST_HELPER if self.helper_lost else 0

    def _asap_do(self, now):
        """What SIGALRM (run everything now) and SIGHUP (reread control) asked for."""
        if self.runasap:
            self.runasap = False
            for ch in self.channels:
                ch.run_all_now(now)
            self.backend.run_all_now()
            # beyond qmail: also scan todo now, for entries whose preprocessing failed
            self.nexttodorun = now
        if self.readasap:
            self.readasap = False
            self.reread()

    def _select_sets(self):
        """The descriptors to wait on, to read and to write (without the trigger)."""
        rfds = [self.wake_r]
        wfds = []
        if self.cleaner.pending and not self.cleaner_lost:
            rfds.append(self.cleaner.reply_fd)
        for ch in self.channels:
            if ch.alive:
                rfds.append(ch.reply_fd)
                if ch.outbuf:
                    wfds.append(ch.cmd_fd)
        return rfds, wfds

    def _wakeup(self, now):
        """The time the loop must wake by; the backend's due deliveries scheduled first."""
        wakeup = now + SLEEP_FOREVER
        if not self.exitasap:
            try:
                for entry in self.backend.due(now):
                    self._add_scheduled(entry)
            except CleanerLost:
                self.cleandied()
            backend_wakeup = self.backend.next_wakeup()
            if backend_wakeup is not None:
                wakeup = min(wakeup, backend_wakeup)
        wakeup = min(wakeup, self.pass_wakeup())
        if not self.exitasap:
            wakeup = min(wakeup, 0 if self.todo else self.nexttodorun)
            wakeup = min(wakeup, 0 if self.cleanup is not None else self.cleanuptime)
            wakeup = min(wakeup, self.metrics.due())
            desk_wakeup = self.desk.wakeup(now)
            if desk_wakeup is not None:
                wakeup = min(wakeup, desk_wakeup)
        return wakeup

    def _timeout(self, now, wakeup):
        """select's timeout: until wakeup (and a second), or the throttle's next opening."""
        timeout = 0 if wakeup <= now else wakeup - now + SLEEP_FUZZ
        gate_wakeup = self.gate.next_wakeup()
        if gate_wakeup is not None:
            timeout = min(timeout, max(0.0, gate_wakeup - time.time()))
        return timeout

    def _work(self, readable, writable):
        """One pass over what select found ready, and the work that is due."""
        if self.wake_r in readable:
            self._drain_wake()
        if self.cleaner.reply_fd in readable:
            try:
                self.cleaner.poll()
            except CleanerLost:
                self.cleandied()
        self.comm_do(writable)
        self.del_do(readable)
        try:
            self.backend.sync_results()     # the reports just recorded, in one fsync
        except QueueError as e:
            self.warn(str(e))
        pulled = self.trigger_fd is not None and self.trigger_fd in readable
        self.todo_do(pulled)
        if not self.exitasap:
            self.desk.do(pulled)
        for p in self.gate.wake(self.now):
            self.by_name[p.channel].schedule(self.now, p.n)
        self.pass_do()
        self._flush_completions()
        self.cleanup_do()
        self.metrics_do()

    def _flush_completions(self):
        """The turn's ended messages: their removed names synced once, then their bodies."""
        if self.cleaner_lost:
            return
        try:
            self.backend.flush_completions()
        except QueueError as e:
            self.warn(str(e))
        except CleanerLost:
            self.cleandied()

    def _drain_wake(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except OSError:
            pass

    def can_exit(self):
        return all(ch.used == 0 for ch in self.channels if ch.alive)

    def finish(self):
        self._flush_completions()
        if not self.cleaner_lost:
            try:
                self.cleaner.drain()
            except CleanerLost:
                pass
        entries = self.gate.saved(int(time.time()))
        for ch in self.channels:
            entries.extend((n, ch.name, due) for due, n in ch.heap)
        self.backend.save_schedule(entries)
        self.metrics_do(force=True)
        self.log(logline.status_exiting())

    def metrics_do(self, force=False):
        """HOME/metrics/qmail.prom when due, and at exit (send/metrics.py)."""
        if not force and int(time.time()) < self.metrics.due():
            return
        try:
            sizes = metrics.queue_sizes(self.backend, os.path.join(self.home, "queue"))
        except OSError as e:
            self.warn("unable to count the queue for metrics: %s" % e.strerror)
            sizes = None
        error = self.metrics.write(sizes, int(time.time()))
        if error:
            self.warn(error)

    def reread(self):
        alert = self.controls.reread()
        if alert:
            self.log(logline.alert(alert))
        self.gate.set_rules(self.controls.rules)
        self._rule_warnings()

    def _rule_warnings(self):
        for text in self.controls.rules.warnings:
            self.warn(text)

    def spawndied(self, ch):
        self.log(logline.alert("oh no! lost spawn connection! dying..."))
        ch.alive = False
        self.helper_lost = self.exitasap = True

    def cleandied(self):
        if not self.cleaner_lost:
            self.log(logline.alert("oh no! lost qmail-clean connection! dying..."))
        self.cleaner_lost = True
        self.helper_lost = self.exitasap = True

    # -- command pipes and replies -------------------------------------------
    def _flush_command(self, ch):
        try:
            written = os.write(ch.cmd_fd, ch.outbuf)
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno == errno.EPIPE:
                self.spawndied(ch)
            return
        ch.outbuf = ch.outbuf[written:]

    def comm_do(self, writable):
        for ch in self.channels:
            if ch.alive and ch.outbuf and ch.cmd_fd in writable:
                self._flush_command(ch)

    def del_do(self, readable):
        for ch in self.channels:
            if ch.alive and ch.reply_fd in readable:
                self.del_dochan(ch)

    def del_dochan(self, ch):
        try:
            data = os.read(ch.reply_fd, 4096)
        except OSError:
            return
        if not data:
            self.spawndied(ch)
            return
        for slot, letter, text in ch.reader.feed(data):
            self.del_result(ch, slot, letter, text)

    def del_result(self, ch, slot, letter, text):
        dl = ch.slots[slot] if slot < ch.concurrency else None
        if dl is None:
            self.warn("internal error: delivery report out of range")
            return
        job = dl.job
        if letter == b"Z" and job.dying:
            letter, text = b"D", text + DYING_TEXT
        # A success reaches the queue before the log: a crash between the two then leaves a
        # recorded delivery without its line, never a logged one the queue does not know
        # and would repeat, so the log bounds what a restart repeats. (A failure keeps
        # qmail's order, line, bounce note, DELIVERY: each repeated failure then has both
        # its line and its note.)
        if letter == b"K":
            self.mark_done(ch, job, dl.record)
            self.log(logline.delivery(dl.d, "success", text))
            metrics.delivery(ch.name, "success")
        elif letter == b"Z":
            self.log(logline.delivery(dl.d, "deferral", text))
            metrics.delivery(ch.name, "deferral")
        elif letter == b"D":
            self.log(logline.delivery(dl.d, "failure", text))
            metrics.delivery(ch.name, "failure")
            self.add_bounce(job.n, dl.record.address, text)
            self.mark_done(ch, job, dl.record)
        else:
            self.log(logline.report_mangled(dl.d))
        self.gate.finished(dl.d)
        self.job_close(ch, job)
        ch.slots[slot] = None
        ch.used -= 1
        self.desk.job_closed(job.n)
        self.status()

    def mark_done(self, ch, job, record):
        try:
            self.backend.mark_done(job.n, ch.name, record)
        except QueueError as e:
            self.warn(str(e))
        job.numtodo -= 1

    def add_bounce(self, n, address, text):
        # the report cut as queuelimits bounds it: every note the message gets fits its snapshot
        note = bounce_note(self.controls.rewriter.strip_virtual_prepend(address), bounce_text(text))
        while True:
            try:
                self.backend.add_bounce_note(n, note)
                return
            except QueueError:
                self.log(logline.alert("unable to append to bounce message; HELP! sleeping..."))
                time.sleep(SLEEP_PAUSE)

    # -- passes ------------------------------------------------------------------
    def pass_wakeup(self):
        if self.exitasap:
            return SLEEP_FOREVER + self.now
        wakeup = self.now + SLEEP_FOREVER
        for ch in self.channels:
            if ch.job is not None and ch.available():
                return 0
        if self.jobs_open < self.numjobs:
            for ch in self.channels:
                if ch.job is None and ch.heap:
                    wakeup = min(wakeup, ch.heap[0][0])
        if self.pqdone:
            wakeup = min(wakeup, self.pqdone[0][0])
        return wakeup

    def pass_do(self):
        for ch in self.channels:
            self.pass_dochan(ch)
        now = self.now
        while self.pqdone and self.pqdone[0][0] <= now and not self.exitasap:
            _, n = heapq.heappop(self.pqdone)
            self.messdone(n)

    def pass_dochan(self, ch):
        """Start deliveries from the current pass; open further passes while slots are free."""
        while not self.exitasap:
            if ch.job is None:
                # As qmail, a pass opens whenever a job is free, slots or not: while it is
                # open and the channel is full, pass_wakeup() waits for a reply instead of
                # waking at once for the channel's overdue queue (a busy loop).
                if self.jobs_open >= self.numjobs or not ch.alive:
                    return
                n = ch.pop_due(self.now)
                if n is None:
                    return
                if not self.pass_open(ch, n):
                    continue
            if not self.pass_step(ch):
                return

    def pass_step(self, ch):
        """Work through the current pass; True when it ended (EOF or garbage)."""
        while True:
            if ch.index >= len(ch.records):
                ch.job.hiteof = True
                self.pass_close(ch)
                return True
            if not ch.available():
                return False
            record = ch.records[ch.index]
            ch.index += 1
            if record.address is None:
                self.warn("unknown record type in %s!" % self.backend.channel_file(ch.job.n, ch.name))
                self.pass_close(ch)
                return True
            if record.done:
                continue
            if ch.job.n in self.desk.quiesce:    # a command waits for it (send/commands.py)
                self.pass_close(ch)
                return True
            job = ch.job
            if job.only is not None and ch.index - 1 not in job.only:
                job.unstarted += 1
                continue
            if self.gate.active:
                hold = self.gate.admit(record.address, job.birth, self.now, ch.name == "remote")
                if hold is not None:
                    job.held.append((ch.index - 1,) + hold)
                    continue
            job.numtodo += 1
            self.del_start(ch, job, record)

    def pass_open(self, ch, n):
        try:
            sender, birth = self.backend.info(n)
            records = self.backend.recipients(n, ch.name)
        except QueueError:
            self.warn("trouble opening %s; will try again later" % self.backend.channel_file(n, ch.name))
            ch.schedule(self.now + SLEEP_SYSFAIL, n)
            return False
        job = Job(n, retry.next_retry(birth, self.now, ch.name), sender,
                  retry.is_dying(birth, self.now, self.controls.lifetime), birth)
        parked = self.gate.take(ch.name, n)
        if parked is not None:          # its pass before was held back in part: go on with it
            job.only, job.retry = parked.indexes, parked.retry
        self.jobs_open += 1
        ch.job, ch.records, ch.index = job, records, 0
        return True

    def pass_close(self, ch):
        job = ch.job
        ch.job, ch.records, ch.index = None, None, 0
        self.job_close(ch, job)
        self.desk.job_closed(job.n)

    def job_close(self, ch, job):
        job.refs -= 1
        if job.refs > 0:
            return
        self.jobs_open -= 1
        if job.held:                    # not an attempt: the gate passes it again (send/throttle.py)
            self.gate.park(ch.name, job.n, job.retry, job.held)
            return
        if job.hiteof and job.numtodo == 0 and not job.unstarted:
            try:
                left = self.backend.finish_channel(job.n, ch.name)
            except QueueError as e:
                self.warn(str(e))
                ch.schedule(int(time.time()) + SLEEP_SYSFAIL, job.n)
                return
            if left:
                return
            heapq.heappush(self.pqdone, (int(time.time()), job.n))
            return
        try:
            self.backend.reschedule(job.n, ch.name, job.retry)     # it offers it again at job.retry
        except QueueError as e:
            self.warn(str(e))
            ch.schedule(job.retry, job.n)

    def del_start(self, ch, job, record):
        slot = ch.free_slot()
        d = self.next_delid
        self.next_delid += 1
        ch.slots[slot] = Delivery(d, job, record)
        job.refs += 1
        ch.used += 1
        recipient = record.address
        ch.outbuf = encode_command(slot, self.backend.message_path(job.n).encode("ascii"),
                                   verp(job.sender, recipient), recipient)
        # Logged before the command leaves, as qmail does (it only buffers it here): a
        # crash can then leave a started delivery that never ran, never one that ran
        # without its line, so the log bounds what may be delivered twice after a restart.
        self.log(logline.starting_delivery(d, job.n, ch.name, recipient))
        if ch.name == "remote":
            self.gate.started(d, recipient)
        self._flush_command(ch)
        self.status()

    # -- completion ---------------------------------------------------------------
    def messdone(self, n):
        try:
            self.backend.sync_results()     # no bounce and no FINISH before the reports are on disk
            if not self.backend.completion_due(n):
                return
        except QueueError as e:
            self.warn(str(e))
            return self._fail_done(n)
        try:
            if not self.inject_bounce(n):
                return self._fail_done(n)
            self.log(logline.end_msg(n))
            self.backend.complete(n)
        except QueueError as e:
            self.warn(str(e))
            return self._fail_done(n)
        except CleanerLost:
            self.cleandied()

    def _fail_done(self, n):
        heapq.heappush(self.pqdone, (int(time.time()) + SLEEP_SYSFAIL, n))

    def inject_bounce(self, n):
        notes = self.backend.bounce_notes(n)
        if notes is None:
            return True
        try:
            sender, _birth = self.backend.info(n)
        except QueueError:
            return False
        base = bounce.bounce_base(sender)
        c = self.controls
        envelope = bounce.bounce_envelope(base, c.doublebounceto, c.doublebouncehost)
        if envelope is None:
            self.log(logline.triple_bounce(n))
        else:
            qp = self._queue_bounce(n, base, envelope, notes)
            if qp is None:
                return False
            if qp is not _DISCARDED:
                self.log(logline.bounce_msg(n, qp))
        self.backend.drop_bounce_notes(n)
        return True

    def _queue_bounce(self, n, base, envelope, notes, refusal=None):
        """The bounce's qp; None to try again later; _DISCARDED when the queue refuses it
        permanently even without the copy of the message (refusal: why the copy is left out)."""
        from qmailpy.queue.client import QueueClient, QueueStartError
        c = self.controls
        env_sender, recipient = envelope
        try:
            qq = QueueClient(self.home)
        except QueueStartError:
            self.warn("unable to start qmail-queue, will try later")
            return None
        try:
            qq.write(bounce.bounce_head(base, recipient, c.bouncefrom, c.bouncehost))
            qq.write(notes)
            if refusal is not None:
                qq.write(bounce.copy_left_out(refusal))
            else:
                qq.write(bounce.bounce_separator(base))
                with open(os.path.join(self.home, "queue", "mess", self.backend.message_path(n)), "rb") as f:
                    while True:
                        chunk = f.read(65536)
                        if not chunk:
                            break
                        qq.write(chunk)
        except OSError:
            qq.abort()
            self.warn("trouble injecting bounce message, will try later")
            return None
        result = qq.finish(env_sender, [recipient])
        if result.ok:
            return result.pid
        if not result.permanent:
            self.warn("trouble injecting bounce message, will try later")
            return None
        # Not in qmail, which retries for ever: the same bounce would be refused again.
        # The text may be a qmail-queue replacement's own (exit 82): one log line all the same.
        text = result.text.replace(b"\n", b"/")
        if refusal is None:
            self.warn(b"bounce message for msg %d permanently refused (%s); sending it without"
                      b" the copy of the message" % (n, text))
            return self._queue_bounce(n, base, envelope, notes, text)
        self.warn(b"bounce message for msg %d permanently refused (%s); discarding it" % (n, text))
        return _DISCARDED

    # -- todo scans -----------------------------------------------------------------
    def todo_do(self, pulled):
        if self.exitasap:
            return
        if self.todo is None:
            if not pulled and self.now < self.nexttodorun:
                return
            self.trigger_fd = self._open_trigger(self.trigger_fd)
            try:
                self.todo = sorted(self.backend.new_work(), reverse=True)
            except QueueError:
                self.log(logline.alert("unable to opendir todo, sleeping..."))
                self.nexttodorun = self.now + SLEEP_PAUSE
                return
            self.nexttodorun = self.now + SLEEP_TODO
        batch = [self.todo.pop() for _ in range(min(TODO_BATCH, len(self.todo)))]
        if not self.todo:
            self.todo = None
        if not batch:
            return
        try:
            results = self.backend.preprocess_batch(batch, self.controls.rewriter.route, self.log)
        except CleanerLost:
            self.cleandied()
            return
        for n, result in results:
            if isinstance(result, SetAside):
                self.log(logline.set_aside(n, str(result)))
            elif isinstance(result, QueueError):
                self.warn(str(result))
            else:
                self.preprocessed(n, result)

    def preprocessed(self, n, p):
        """Schedule a preprocessed message's channels (or its completion).

        Its `new msg` and `info msg` lines were logged while it was preprocessed. A
        message held until a not-before time goes back to the backend, due then; so does
        one its queueing asked to hold (docs/queue-format.md "Hold at queueing"), which the
        backend made held, on disk, before preprocessing ended: it keeps it from delivery
        until `qmailctl queue release`."""
        now = int(time.time())
        not_before = self.not_before(n, now) if p.channels else None
        held = bool(p.channels) and self.backend.is_held(n)
        if held:
            self.log(logline.command_msg("hold", n))
            if not_before is None:
                not_before = now
        for name in p.channels:
            if not_before is None:
                self.by_name[name].schedule(now, n)
                continue
            try:
                self.backend.reschedule(n, name, not_before)
            except QueueError as e:
                self.warn(str(e))
                if not held:                # a held one waits for its release, not here
                    self.by_name[name].schedule(not_before, n)
        if not p.channels:
            heapq.heappush(self.pqdone, (now, n))

    def not_before(self, n, now):
        """Message n's not-before time if it is still ahead: its mess file's mtime
        (docs/queue-format.md "Not-before time"); None otherwise."""
        try:
            mtime = int(os.stat(os.path.join("mess", self.backend.message_path(n))).st_mtime)
        except OSError:
            return None
        return mtime if mtime > now else None

    # -- 36-hour cleanup ------------------------------------------------------------
    def cleanup_do(self):
        if self.exitasap:
            return
        if self.cleanup is None:
            if self.now < self.cleanuptime:
                return
            self.cleanup = self.backend.stale_messages(self.now)
        try:
            n = next(self.cleanup)
        except StopIteration:
            self.cleanup = None
            self.cleanuptime = self.now + SLEEP_CLEANUP
            return
        if n is None:                   # a step the backend took itself (base.stale_messages)
            return
        try:
            self.backend.complete(n)
        except QueueError as e:
            self.warn(str(e))
        except CleanerLost:
            self.cleandied()
