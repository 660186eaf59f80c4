"""The injector side of qmail-queue (docs/protocols.md "qmail-queue interface"): what qmail's qmail.c does for
qmail-inject, qmail-smtpd, qmail-local forwards and qmail-send bounces.

    qq = QueueClient(home)          # forks the queueing child now
    qq.write(data)                  # message bytes (buffered), as often as needed
    result = qq.finish(sender, recipients)   # bytes; closes fd 0, writes fd 1, waits
    result.code / .pid / .ok / .permanent / .text
    qq.abort()                      # give up: the envelope never completes, nothing is queued

The child gets the message pipe on fd 0, the envelope pipe on fd 1 and the
write end of an error pipe on fd 6, and chdirs to the home (failure: exit 61).
If $QMAILQUEUE is set it is exec'd verbatim (no PATH search, no arguments;
exec failure: exit 120); so is HOME/bin/qmail-queue, which is qmail-qmqpc, in a
mini-qmail home (qmailpy.home.mini_queue). Otherwise the child runs qmailpy.queue.qmailqueue.run()
itself and leaves with os._exit(): a fork, not a fresh interpreter, so queueing
costs no Python start-up. result.pid is the child's pid, the "qp".

Callers must ignore SIGPIPE (Python does by default): a child that exits early
turns the next write into EPIPE, reported as "qq read error".
Forking in a process with other threads is unsafe in general; the callers
(qmail-smtpd, sendmail/qmail-inject, qmail-local, qmail-send) are single
threaded. A caller that reaps children with waitpid(-1) must leave this pid
alone until finish() returns.

QueueStartError (an OSError) means no child could be started (pipe/fork
failure): qmail-smtpd answers `451 qqt failure (#4.3.0)`.

Without queue rights (home.has_queue_rights: not root, not the owner of the queue)
no child is forked: QueueClient returns a ServerSubmission, which holds the
message in bounded memory (qmailpy.queue.spool: beyond 1 MiB in an unlinked file)
and hands it to qmail-qmqpd over the local socket SOCKET in one QMQP
request (qmailpy.queue.qmqp) at finish(). The server queues it for the uid the
kernel reports for this process, with qmail-queue's code, and answers with
qmail-queue's text; Result.code is then the exit code qmail-queue gave (the
first code with that text), or, for a server that cannot be reached or dies
mid-request, 74 ("communication with mail server failed", what qmail-qmqpc
exits with), with a text that names the socket.

Imports are kept to os and sys: this module is loaded by every injector.
"""
import os

from qmailpy.fileio import write_all
from qmailpy.home import has_queue_rights, mini_queue

_BUFFER = 65536
# qmail-qmqpd's answer to an address holding a NUL, which qmail-queue's envelope cannot carry
ADDRESS_REFUSED = b"Dsorry, I can't accept addresses like that (#5.1.3)"

# Texts of qmail.c's qmail_close(), class letter first (docs/protocols.md "qmail-queue interface").
_TEXTS = {
    11: b"Denvelope address too long for qq (#5.1.3)",
    115: b"Denvelope address too long for qq (#5.1.3)",
    12: b"Dtoo many recipients for qq (#5.5.3)",     # qmailpy.queuelimits
    31: b"Dmail server permanently rejected message (#5.3.0)",
    51: b"Zqq out of memory (#4.3.0)",
    52: b"Zqq timeout (#4.3.0)",
    53: b"Zqq write error or disk full (#4.3.0)",
    54: b"Zqq read error (#4.3.0)",
    55: b"Zqq unable to read configuration (#4.3.0)",
    56: b"Zqq trouble making network connection (#4.3.0)",
    61: b"Zqq trouble in home directory (#4.3.0)",
    62: b"Zqq trouble creating files in queue (#4.3.0)",
    63: b"Zqq trouble creating files in queue (#4.3.0)",
    64: b"Zqq trouble creating files in queue (#4.3.0)",
    65: b"Zqq trouble creating files in queue (#4.3.0)",
    66: b"Zqq trouble creating files in queue (#4.3.0)",
    71: b"Zmail server temporarily rejected message (#4.3.0)",
    72: b"Zconnection to mail server timed out (#4.4.1)",
    73: b"Zconnection to mail server rejected (#4.4.1)",
    74: b"Zcommunication with mail server failed (#4.4.2)",
    81: b"Zqq internal bug (#4.3.0)",
    91: b"Zqq internal bug (#4.3.0)",
    120: b"Zunable to exec qq (#4.3.0)",
}
_READ_ERROR = _TEXTS[54]
_CRASHED = b"Zqq crashed (#4.3.0)"
_PERMANENT = b"Dqq permanent problem (#5.3.0)"
_TEMPORARY = b"Zqq temporary problem (#4.3.0)"

# The local queue socket, relative to the home (its directory is in queue-layout/layout.conf).
SOCKET = "run/qmqp.sock"
SERVER_TIMEOUT = 1200   # seconds a submission waits on the server for each read or write
NO_SERVER = 74          # qmail-qmqpc's exit code when no server answers

_live = set()           # parent-side fds of every unfinished client, closed in new children


class QueueStartError(OSError):
    """No queueing child could be started (pipe or fork failed)."""


def explain(code, caller_write_error=False, fd6=b""):
    """qmail's class-prefixed text for an exit status (None = killed by a signal)."""
    if code is None:
        return _CRASHED
    if code == 0:
        return _READ_ERROR if caller_write_error else b""
    if code == 82 and len(fd6) > 2:
        return fd6
    if code in _TEXTS:
        return _TEXTS[code]
    return _PERMANENT if 11 <= code <= 40 else _TEMPORARY


class Result:
    """Outcome of one queueing: exit code (None if killed), child pid, qmail's text."""
    __slots__ = ("code", "pid", "text", "ok", "permanent")

    def __init__(self, code, pid, marked):
        self.code = code
        self.pid = pid
        self.ok = marked == b""
        self.permanent = marked[:1] == b"D"
        self.text = marked[1:]          # without the D/Z class letter

    def __repr__(self):
        return "Result(code=%r, pid=%r, text=%r)" % (self.code, self.pid, self.text)


def QueueClient(home, environ=None, prefer_server=False, not_before=None, hold=False):
    """Start queueing one message: a ForkedQueue child, or with $QMAILQUEUE unset and no
    queue rights, a ServerSubmission to qmail-qmqpd. Both have write/finish/abort.

    prefer_server: a long-lived caller with queue rights (a qmail-smtpd session worker)
    hands the message to qmail-qmqpd too, which queues it without a fork, and forks
    qmail-queue's code itself only when no server answers.
    not_before: hold the message's delivery until then (epoch seconds; without it,
    $QMAILNOTBEFORE does, as for qmail-queue). hold: queue it on hold, for `qmailctl
    queue release` (without it, $QMAILHOLD=1 does); a $QMAILQUEUE or mini-qmail program
    may not honour it: callers that must not deliver ask hold_reaches_queue() first."""
    environ = os.environ if environ is None else environ
    program = environ.get("QMAILQUEUE")
    if program is None:
        program = mini_queue(home)
    if program is None:
        if not has_queue_rights(home):
            return ServerSubmission(home, not_before=not_before, hold=hold)
        if prefer_server:
            return ServerSubmission(home, fallback=True, not_before=not_before, hold=hold)
    return ForkedQueue(home, program, not_before, hold)


def hold_reaches_queue(home, environ):
    """Whether a hold asked of QueueClient reaches this home's queue: not through a
    $QMAILQUEUE program or a mini-qmail home's qmail-qmqpc, which do not read $QMAILHOLD."""
    return "QMAILQUEUE" not in environ and mini_queue(home) is None


def code_of(marked):
    """qmail-queue's exit code for a class-prefixed text: the first code with that text,
    else 71 for Z and 31 for D (qmail-qmqpc's), 0 for K."""
    if marked[:1] == b"K":
        return 0
    for code, text in _TEXTS.items():
        if text == marked:
            return code
    return 31 if marked[:1] == b"D" else 71


class ServerSubmission:
    """One message for qmail-qmqpd, held in a qmailpy.queue.spool.Spool (bounded memory)
    and sent in one request at finish().

    fallback: when no server can be reached, queue it with a ForkedQueue instead (only
    for a caller with queue rights). A server reached that fails mid-request is not
    retried so: the message may have been queued.

    not_before (or else $QMAILNOTBEFORE) and hold (or else $QMAILHOLD) go in the local
    socket's options."""

    def __init__(self, home, fallback=False, not_before=None, hold=False):
        from qmailpy.queue.spool import Spool
        self.home, self.fallback, self.not_before = home, fallback, not_before
        self.hold = hold
        self.path = os.path.join(home, SOCKET)
        self.pid = None
        self._spool = Spool()
        self._result = None

    def write(self, data):
        if self._result is None:
            self._spool.write(data)

    def abort(self):
        """Nothing was sent: nothing is queued."""
        if self._result is None:
            self._spool.close()
            self._result = Result(54, None, _READ_ERROR)
        return self._result

    def finish(self, sender, recipients):
        if self._result is not None:
            return self._result
        try:
            self._result = self._submit(sender, recipients)
        finally:
            self._spool.close()
        return self._result

    def _submit(self, sender, recipients):
        not_before, hold = self.not_before, self.hold
        from qmailpy.mess import hold_of, not_before_of
        try:
            if not_before is None:
                not_before = not_before_of(os.environ)
            hold = hold or hold_of(os.environ)
        except ValueError:                  # as qmail-queue: before anything is made
            return Result(55, None, explain(55))
        spool = self._spool
        if spool.error is not None:
            return _spool_failure(spool.error)
        from qmailpy.queue import qmqp
        from qmailpy.queuereply import qp_of
        head, tail = qmqp.frame(spool.size, sender, recipients, not_before, hold)
        spool_failed = []

        def send(sock):
            from qmailpy.queue.spool import SpoolError
            sock.sendall(head)
            try:
                for piece in spool.pieces():
                    sock.sendall(piece)
            except SpoolError as e:
                spool_failed.append(e)
                sock.shutdown(1)            # SHUT_WR: the server sees a short request, queues nothing
                return
            sock.sendall(tail)

        try:
            answer = qmqp.exchange(self.path, send, SERVER_TIMEOUT)
        except qmqp.Failed as e:
            if spool_failed:
                return _spool_failure(spool_failed[0])
            return Result(NO_SERVER, None, b"Zcommunication with the queue server at %s"
                          b" failed: %s (#4.3.0)" % (os.fsencode(self.path), e.reason.encode()))
        except qmqp.Unreachable as e:
            if self.fallback:
                return self._forked(sender, recipients, not_before, hold)
            return Result(NO_SERVER, None, b"Zno queue server at %s: %s;"
                          b" is qmail-qmqpd running? (#4.3.0)"
                          % (os.fsencode(self.path), e.reason.encode()))
        if spool_failed:
            return _spool_failure(spool_failed[0])
        if (not_before is not None or hold) and answer == qmqp.NOT_QMQP:
            # a qmail-qmqpd from before the option (not restarted since an upgrade): the
            # request is sound, so this is not the message's fault
            answer = (b"Zthe queue server takes no hold time; restart qmail-qmqpd (#4.3.0)"
                      if not_before is not None else
                      b"Zthe queue server cannot queue on hold; restart qmail-qmqpd (#4.3.0)")
        code = code_of(answer)
        if code == 0:
            self.pid = qp_of(answer)
            answer = b""
        return Result(code, self.pid, answer)

    def _forked(self, sender, recipients, not_before, hold):
        try:
            forked = ForkedQueue(self.home, not_before=not_before, hold=hold)
        except QueueStartError:
            return Result(None, None, b"Zqqt failure (#4.3.0)")
        try:
            for piece in self._spool.pieces():
                forked.write(piece)
        except OSError:
            return forked.abort()
        return forked.finish(sender, recipients)


def _spool_failure(error):
    """qmail-queue's 53 (write error or disk full), with why the message could not be held."""
    return Result(53, None, b"Z" + os.fsencode(error.strerror) + b" (#4.3.0)")


class ForkedQueue:
    """qmail-queue's code (or $QMAILQUEUE's program) in a child; not_before sets its
    $QMAILNOTBEFORE, hold its $QMAILHOLD."""

    def __init__(self, home, program=None, not_before=None, hold=False):
        import _signal
        # A parent that ignores SIGCHLD (swaks --pipe) passes that on: the child would
        # then be reaped by the kernel, waitpid would fail, and a message that was
        # queued would be reported as a failure, so the caller sends it again.
        if _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        if program is None:
            from qmailpy.queue import qmailqueue
            qmailqueue.prepare(home)
        fds = []
        try:
            for _ in range(3):
                fds.extend(os.pipe())
            msg_r, msg_w, env_r, env_w, err_r, err_w = fds
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            raise QueueStartError(e.errno, "unable to start qmail-queue: %s" % e.strerror) from e
        if pid == 0:
            if not_before is not None:
                from qmailpy.mess import NOT_BEFORE
                os.environ[NOT_BEFORE] = "%d" % not_before
            if hold:
                from qmailpy.mess import HOLD
                os.environ[HOLD] = "1"
            _child(home, program, msg_r, env_r, err_w, (msg_w, env_w, err_r))
        os.close(msg_r)
        os.close(env_r)
        os.close(err_w)
        self.pid = pid
        self._owner = os.getpid()
        self._msg, self._env, self._err = msg_w, env_w, err_r
        _live.update((msg_w, env_w, err_r))
        self._buf = bytearray()
        self._write_error = False
        self._result = None

    # -- message ----------------------------------------------------------
    def write(self, data):
        if self._write_error or self._msg is None:
            return
        self._buf += data
        if len(self._buf) >= _BUFFER:
            self._flush()

    def _flush(self):
        try:
            write_all(self._msg, self._buf)
        except OSError:
            self._write_error = True
        self._buf.clear()

    def _close(self, name):
        fd = getattr(self, name)
        if fd is not None:
            os.close(fd)
            _live.discard(fd)
            setattr(self, name, None)

    # -- envelope and result ----------------------------------------------
    def finish(self, sender, recipients):
        """Close the message, send the envelope, wait; a Result."""
        if self._result is not None:
            return self._result
        if b"\0" in sender or any(b"\0" in rcpt for rcpt in recipients):
            # the envelope would break (qmail-queue's 91, which leaves its files behind)
            self.abort()
            self._result = Result(code_of(ADDRESS_REFUSED), self.pid, ADDRESS_REFUSED)
            return self._result
        if not self._write_error:
            self._flush()
        self._close("_msg")
        if not self._write_error:
            parts = [b"F", sender, b"\0"]
            for rcpt in recipients:
                parts += [b"T", rcpt, b"\0"]
            parts.append(b"\0")
            try:
                write_all(self._env, b"".join(parts))
            except OSError:
                self._write_error = True
        return self._wait()

    def abort(self):
        """Give up: the child sees an envelope without its final NUL and queues nothing."""
        if self._result is not None:
            return self._result
        self._write_error = True
        self._buf.clear()
        self._close("_msg")
        return self._wait()

    def _wait(self):
        self._close("_env")
        try:
            _, wstat = os.waitpid(self.pid, 0)
        except ChildProcessError:               # someone else reaped it (qmail's wording)
            self._close("_err")
            self._result = Result(None, self.pid, b"Zqq waitpid surprise (#4.3.0)")
            return self._result
        code = os.waitstatus_to_exitcode(wstat)
        if code < 0:
            code = None
        fd6 = b""
        if code == 82:
            try:
                fd6 = os.read(self._err, 255)
            except OSError:
                fd6 = b""
        self._close("_err")
        self._result = Result(code, self.pid, explain(code, self._write_error, fd6))
        return self._result

    def __del__(self):
        """Forgotten without finish(): abort, so that nothing is queued and no zombie stays."""
        try:
            if self._result is None and os.getpid() == self._owner:
                self.abort()
        except (OSError, AttributeError):
            pass



def _child(home, program, msg_r, env_r, err_w, parent_fds):
    """In the forked child: wire fds 0, 1, 6, chdir home, exec or run; never returns."""
    code = 81
    try:
        import fcntl
        for fd in set(parent_fds) | _live:
            try:
                os.close(fd)
            except OSError:
                pass
        # Copy the three ends above 6 first so that no dup2 overwrites another.
        ends = (msg_r, env_r, err_w)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 7) for fd in ends]
        for fd in ends:
            os.close(fd)
        for fd, target in zip(high, (0, 1, 6)):
            os.dup2(fd, target, inheritable=True)
            os.close(fd)
        try:
            os.chdir(home)
        except OSError:
            os._exit(61)
        if program is not None:
            try:
                os.execv(program, [program])
            except (OSError, ValueError):
                os._exit(120)
        from qmailpy.queue import qmailqueue
        code = qmailqueue.run(home, msg_fd=0, env_fd=1)
    except BaseException:
        code = 81
    finally:
        os._exit(code)
