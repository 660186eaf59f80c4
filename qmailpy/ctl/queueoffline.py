"""qmailctl queue delete while qmail-send is down (docs/queue-operations.md "Deleting while
qmail-send is down"): the same removal as qmail-send's, done by qmailctl itself.

qmailctl takes lock/sendmutex exactly as qmail-send does (exclusive, without waiting),
so the two never work on the queue at once: if a qmail-send holds it, the caller
hands the command to qmail-send instead; a qmail-send that starts while qmailctl holds
it refuses to start ("qmail-send is already running") and its supervisor starts it
again a moment later, once the delete is done. The work runs in a child process with
the accounts qmail-start gives them (root never works by path in the queue): it runs
qmail-clean (as qmailq, for todo/, intd/ and mess/) and does qmail-send's part itself
(as qmails, for everything else, the mutex first): the backend's startup
(recovery, on the log backend), take(), and delete() or delete_queued() for each
message, then commit(). qmailctl prints one line per message as for the command
channel, and logs `delete msg N` (logline.command_msg, qmail-send's own line) for each
message deleted in qmail-send's log, HOME/log/qmail-send.log, as the log writer does
(logwriter.RotatingLog: stamped, rotated, under the log directory's lock that a
supervised writer takes too). The log is opened before anything is deleted: when it
cannot be, nothing is (qmail-send too stops rather than act unlogged).
"""
import contextlib
import fcntl
import os
import sys

from qmailpy import command


EXIT_SEND_RUNNING = 3          # the worker's exit: a qmail-send holds the mutex


def lock_send(queue):
    """lock/sendmutex held exclusively (its descriptor), or None while a qmail-send holds it.
    Opened through queue/lock's descriptor (qmailpy.nofollow): lock/ is qmailq's, and a
    FIFO planted as sendmutex would hold an open for writing until a reader came, a
    symlink would have it open another file; either is nofollow.Refused."""
    from qmailpy import nofollow
    lock = nofollow.open_path(queue, "lock")
    try:
        fd = nofollow.open_file("sendmutex", lock, os.O_WRONLY)
    finally:
        os.close(lock)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _start_clean(home):
    """qmail-clean as qmail-start runs it (as qmailq when we are root): (pid, request fd, reply fd)."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            from qmailpy import privs
            privs.become(home, "qmailq")
            os.chdir("/")
            os.dup2(req_r, 0)
            os.dup2(rep_w, 1)
            os.execvp("qmail-clean", ["qmail-clean"])
        except BaseException:
            pass
        os._exit(111)
    os.close(req_r)
    os.close(rep_w)
    return pid, req_w, rep_r


def run(args):
    """qmailctl queue delete when qmail-send is down: the exit code, as queueact.run's;
    None when a qmail-send holds its mutex (queueact then hands it the command)."""
    from qmailpy.ctl import queueact, queuefilter
    from qmailpy.home import qmail_home
    wanted = queuefilter.from_args(args)
    if wanted.numbers is None and not any(getattr(wanted, f) is not None for f in queueact._FILTERS):
        return None                              # queueact says what is wrong
    from qmailpy import logline
    from qmailpy.logfiles import SEND_LOG
    from qmailpy.ctl.logwriter import open_for_append, stamped
    home = qmail_home(args.home)
    try:
        if queueact.send_running(home):
            return None                          # qmail-send deletes and logs it itself
    except OSError:
        pass                                     # lock_send says what is wrong
    try:
        log = open_for_append(home, SEND_LOG)
    except OSError as e:
        print("qmailctl queue delete: qmail-send is not running, and its log cannot be written "
              "(%s); nothing done" % e, file=sys.stderr)
        return queueact.EXIT_TEMP
    try:
        answers = delete(home, lambda: queueact.select_numbers(home, wanted))
    except OSError as e:
        log.close()
        print("qmailctl queue delete: qmail-send is not running, and deleting without it "
              "failed: %s; some of the messages may be deleted: list the queue" % e, file=sys.stderr)
        return queueact.EXIT_TEMP
    with contextlib.closing(log):
        if answers is None:
            return None
        log.write_lines(stamped([logline.command_msg("delete", n).rstrip(b"\n")
                                 for n, result, _ in answers if result == command.DONE]))
    if not answers:
        print("qmailctl queue delete: no message matches", file=sys.stderr)
        return queueact.EXIT_NOT_DONE
    status = 0
    for n, result, text in answers:
        if result == command.DONE:
            print("%d: %s" % (n, text))
        else:
            print("qmailctl queue delete: %d: %s" % (n, text), file=sys.stderr)
            status = queueact.EXIT_NOT_DONE
    return status


def delete(home, select):
    """[(n, result, text)] for each number select() gives (called once the mutex is held,
    so the filters read the queue qmail-send will find): command.DONE or NONE, as
    qmail-send answers; None when a qmail-send holds the mutex. OSError when the work
    could not be done (its text says why; some of the messages may be deleted by then).

    The work runs in a child process with qmail-send's account (and qmail-clean its
    own), so that root never works by path in the queue's directories; the answers
    come back over a pipe, as a command reply."""
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 111
        try:
            os.close(out_r)
            code = _work(home, select, out_w)
        except BaseException as e:                # said to the parent, which reports it
            try:
                os.write(out_w, b"! " + str(e).encode("utf-8", "replace")[:400] + b"\n")
            except OSError:
                pass
        os._exit(code)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == EXIT_SEND_RUNNING:
        return None
    if code != 0 or data.startswith(b"! "):
        raise OSError(data[2:].decode("utf-8", "replace").strip() if data.startswith(b"! ")
                      else "exit status %d" % code)
    return list(command.decode_reply(data))


def _work(home, select, out_fd):
    """In the child: qmail-clean, then qmail-send's account, the mutex, the deletes."""
    from qmailpy import privs
    from qmailpy.backends import open_backend
    from qmailpy.send.clean import CleanClient
    from qmailpy.fileio import write_all
    pid, req_w, rep_r = _start_clean(home)
    try:
        privs.become(home, "qmails")             # as qmail-send: before touching the queue
        mutex = lock_send(os.path.join(home, "queue"))
        if mutex is None:
            return EXIT_SEND_RUNNING
        numbers = select()
        if not numbers:
            return 0
        cleaner = CleanClient(req_w, rep_r)
        backend = open_backend(home, cleaner=cleaner, log=lambda line: None)
        try:
            answers = _delete_all(backend, numbers)
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        write_all(out_fd, command.encode_reply(answers))
        return 0
    finally:
        os.close(req_w)                          # qmail-clean exits at end of file
        os.close(rep_r)
        os.waitpid(pid, 0)


def _delete_all(backend, numbers):
    backend.startup()
    preprocessed, queued = backend.take(numbers)
    preprocessed, queued = set(preprocessed), set(queued)
    answers = []
    for n in numbers:
        if n in preprocessed and backend.bring(n):
            backend.delete(n)
        elif n in queued:
            backend.delete_queued(n)
        else:
            answers.append((n, command.NONE, "not in queue"))
            continue
        answers.append((n, command.DONE, "deleted"))
    backend.commit()
    finish = getattr(backend, "checkpoint", None)    # the log backend cleans bodies there
    if finish is not None:
        finish(force=True)
    backend.cleaner.drain()                          # the directory backend's async foop/
    return answers
