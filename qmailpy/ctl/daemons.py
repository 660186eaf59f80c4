"""qmailctl start | stop | stat | doqueue | reload | queue: run a home's daemons.

start   runs `qmail-start DEFAULTDELIVERY` in the background. qmail-send's log
        (qmail-start's stdout) goes through a small log writer that prefixes
        each line with an ISO-8601 UTC timestamp and appends it to
        HOME/log/qmail-send.log, rotated by size (qmailpy/ctl/logwriter.py,
        control/logsize and control/logcount). The pid of qmail-send (qmail-start execs into
        it) goes to HOME/log/qmail-send.pid. With --smtp HOST:PORT it also
        runs `qmail-smtpd-listen HOST:PORT`, logging to HOME/log/qmail-smtpd.log.
        With --submission HOST:PORT it runs a second qmail-smtpd-listen there
        with SMTPAUTH=! (STARTTLS, then AUTH before MAIL; log
        HOME/log/qmail-submission.log, pid HOME/log/qmail-submission.pid).
        First of all it starts the queue server qmail-qmqpd (log
        HOME/log/qmail-qmqpd.log, pid HOME/log/qmail-qmqpd.pid), through which
        every submitter without queue rights queues.
stop    SIGTERM to qmail-send (and the SMTP listeners), then waits until they
        and qmail-send's helpers are gone; then stops qmail-qmqpd.
stat    the daemons (psutil) and the queue counts.
doqueue SIGALRM: every queued message is retried now.
reload  SIGHUP: qmail-send rereads locals and virtualdomains.
queue   qmail-qread, then qmail-qstat.
"""
import os
import signal
import subprocess
import sys
import time

HELP = "run the daemons of a home (start, stop, stat, doqueue, reload, queue)"
SEND_LOG = "qmail-send.log"
SMTPD_LOG = "qmail-smtpd.log"
SEND_PID = "qmail-send.pid"
SMTPD_PID = "qmail-smtpd.pid"
QMQPD_LOG = "qmail-qmqpd.log"
QMQPD_PID = "qmail-qmqpd.pid"
SUBMISSION_LOG = "qmail-submission.log"
SUBMISSION_PID = "qmail-submission.pid"
START_TIMEOUT = 15
STOP_TIMEOUT = 60


def add_arguments(parser, name):
    if name == "start":
        parser.add_argument("--smtp", metavar="HOST:PORT",
                            help="also accept SMTP on HOST:PORT (qmail-smtpd-listen)")
        parser.add_argument("--submission", metavar="HOST:PORT",
                            help="also accept mail submission on HOST:PORT (qmail-smtpd-listen"
                                 " with SMTPAUTH=!: STARTTLS and AUTH before MAIL)")
        parser.add_argument("--defaultdelivery", default="./Maildir/",
                            help="qmail-start's default delivery (default ./Maildir/)")
    elif name == "stop":
        parser.add_argument("--timeout", type=float, default=STOP_TIMEOUT,
                            help="seconds to wait for the daemons to exit")


# --- helpers ------------------------------------------------------------------

def _home(args):
    from qmailpy.home import qmail_home
    return os.path.abspath(qmail_home(args.home))


def _logdir(home):
    path = os.path.join(home, "log")
    os.makedirs(path, mode=0o755, exist_ok=True)
    return path


def _env(home):
    """The daemons' environment: QMAILHOME, and a PATH on which qmail-start is found:
    HOME/bin first when `qmailctl init` wrote the programs there (as qmail's rc does)."""
    import shutil
    from qmailpy.home import BIN
    env = dict(os.environ)
    env["QMAILHOME"] = home
    path = env.get("PATH", "/usr/bin:/bin")
    if shutil.which("qmail-start", path=path) is None:
        path = os.path.dirname(sys.executable) + os.pathsep + path
    if os.path.isdir(os.path.join(home, BIN)):
        path = os.path.join(home, BIN) + os.pathsep + path
    env["PATH"] = path
    return env


def _read_pid(home, name):
    try:
        with open(os.path.join(home, "log", name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _process(pid, needle):
    """psutil.Process for pid if it is alive and its command line mentions needle."""
    import psutil
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if any(needle in part for part in proc.cmdline()):
            return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return None


def running_send(home):
    return _process(_read_pid(home, SEND_PID), "qmail-send")


def running_smtpd(home):
    return _process(_read_pid(home, SMTPD_PID), "qmail-smtpd-listen")


def running_submission(home):
    return _process(_read_pid(home, SUBMISSION_PID), "qmail-smtpd-listen")


def running_listeners(home):
    return [p for p in (running_smtpd(home), running_submission(home)) if p is not None]


def running_qmqpd(home):
    return _process(_read_pid(home, QMQPD_PID), "qmail-qmqpd")


def _start_qmqpd(home, logdir, env):
    """Start qmail-qmqpd unless it runs; False (and why, on stderr) if it does not come up."""
    if running_qmqpd(home):
        return True
    logpath = os.path.join(logdir, QMQPD_LOG)
    offset = os.path.getsize(logpath) if os.path.exists(logpath) else 0
    proc = _spawn_recorded(["qmail-qmqpd"], env, logpath, QMQPD_PID)
    if proc is None:
        return False
    if not _wait_for_line(logpath, offset, b"listening on", proc, START_TIMEOUT):
        print("qmailctl: qmail-qmqpd did not start:\n%s" % _tail(logpath, offset), file=sys.stderr)
        _stop_started(home)
        return False
    print("qmail-qmqpd started (pid %d), log %s" % (proc.pid, logpath))
    return True


def _spawn_logged(argv, env, logpath, cwd="/"):
    """Start argv in its own session with stdout/stderr through a log writer; its pid."""
    log_r, log_w = os.pipe()
    from qmailpy.ctl.logwriter import limits
    size, count = limits(env["QMAILHOME"])
    writer = subprocess.Popen([sys.executable, "-m", "qmailpy.ctl.logwriter", logpath, str(size), str(count)],
                              stdin=log_r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env=env, cwd="/")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_w, stderr=log_w,
                                start_new_session=True, env=env, cwd=cwd)
    finally:
        os.close(log_r)
        os.close(log_w)
    return proc, writer


def _write_pid(path, pid):
    """path holds pid whole or not at all: a full disk must not leave an empty pid file."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write("%d\n" % pid)
        os.rename(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _spawn_recorded(argv, env, logpath, pidname):
    """_spawn_logged, then the pid in HOME/log/pidname; when that cannot be written
    (a full disk), stat and stop could not find the daemon: it is stopped, and None."""
    proc, writer = _spawn_logged(argv, env, logpath)
    path = os.path.join(os.path.dirname(logpath), pidname)
    try:
        _write_pid(path, proc.pid)
    except OSError as e:
        _stop_spawned(proc, writer)
        print("qmailctl: cannot write %s: %s; %s stopped" % (path, e.strerror, argv[0]), file=sys.stderr)
        return None
    return proc


def _stop_spawned(proc, writer):
    """Stop a daemon just started (with the helpers it may have started) and its log writer."""
    import psutil
    try:
        procs = [psutil.Process(proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for left in _terminate(procs, START_TIMEOUT):
        try:
            left.kill()
        except psutil.NoSuchProcess:
            pass
    for child in (proc, writer):
        try:
            child.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _wait_for_line(path, offset, needle, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                if needle in f.read():
                    return True
        except OSError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _tail(path, offset):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# --- subcommands --------------------------------------------------------------

def _not_a_home(home):
    """True (after saying so on stderr) when home has no queue/ or control/me."""
    if os.path.isdir(os.path.join(home, "queue")) and os.path.isfile(os.path.join(home, "control", "me")):
        return False
    print("qmailctl: %s is not a qmail home (make one with: qmailctl init --home %s)" % (home, home),
          file=sys.stderr)
    return True


def start(args):
    home = _home(args)
    if _not_a_home(home):
        return 1
    if running_send(home):
        print("qmailctl: qmail-send is already running in %s" % home, file=sys.stderr)
        return 1
    try:
        logdir = _logdir(home)
    except OSError as e:
        print("qmailctl: cannot make %s/log: %s" % (home, e.strerror), file=sys.stderr)
        return 1
    env = _env(home)
    if not _start_qmqpd(home, logdir, env):
        return 1
    logpath = os.path.join(logdir, SEND_LOG)
    offset = os.path.getsize(logpath) if os.path.exists(logpath) else 0
    proc = _spawn_recorded(["qmail-start", args.defaultdelivery], env, logpath, SEND_PID)
    if proc is None:
        _stop_started(home)
        return 1
    if not _wait_for_line(logpath, offset, b"status: local", proc, START_TIMEOUT):
        print("qmailctl: qmail-send did not start:\n%s" % _tail(logpath, offset), file=sys.stderr)
        _stop_started(home)
        return 1
    print("qmail-send started (pid %d), log %s" % (proc.pid, logpath))
    if args.smtp and not _start_listener(home, logdir, env, args.smtp, SMTPD_LOG, SMTPD_PID):
        return 1
    if args.submission:
        for name in ("servercert.pem", "checkpassword"):
            if not os.path.exists(os.path.join(home, "control", name)):
                print("qmailctl: warning: no control/%s: the submission port cannot offer AUTH,"
                      " so it takes no mail" % name, file=sys.stderr)
        if not _start_listener(home, logdir, dict(env, SMTPAUTH="!"), args.submission,
                               SUBMISSION_LOG, SUBMISSION_PID):
            return 1
    return 0


def _start_listener(home, logdir, env, address, logname, pidname):
    """qmail-smtpd-listen on address; False (what it said on stderr, everything stopped) if it fails."""
    logpath = os.path.join(logdir, logname)
    offset = os.path.getsize(logpath) if os.path.exists(logpath) else 0
    proc = _spawn_recorded(["qmail-smtpd-listen", address], env, logpath, pidname)
    if proc is None:
        _stop_started(home)
        return False
    if not _wait_for_line(logpath, offset, b"listening on", proc, START_TIMEOUT):
        print("qmailctl: qmail-smtpd-listen %s did not start:\n%s" % (address, _tail(logpath, offset)),
              file=sys.stderr)
        _stop_started(home)
        return False
    print("qmail-smtpd-listen started on %s (pid %d), log %s" % (address, proc.pid, logpath))
    return True


def _stop_started(home):
    """A start that failed half way leaves nothing running: stop what it started."""
    import psutil
    # qmail-qmqpd last, as stop does: qmail-send's bounces go through it
    for started in ((*running_listeners(home), running_send(home)), (running_qmqpd(home),)):
        for proc in _terminate([p for p in started if p is not None], START_TIMEOUT):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    for name in (SMTPD_PID, SUBMISSION_PID, SEND_PID, QMQPD_PID):
        try:
            os.unlink(os.path.join(home, "log", name))
        except OSError:
            pass


def _terminate(procs, timeout):
    import psutil
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


def stop(args):
    home = _home(args)
    send = running_send(home)
    listeners = running_listeners(home)
    qmqpd = running_qmqpd(home)
    if send is None and not listeners and qmqpd is None:
        print("qmailctl: nothing is running in %s" % home)
        return 0
    import psutil
    procs = list(listeners)
    helpers = []
    if send is not None:
        try:
            helpers = send.children()
        except psutil.NoSuchProcess:
            pass
        procs.append(send)
    alive = _terminate(procs, args.timeout)
    if not alive:
        _, alive = psutil.wait_procs(helpers, timeout=args.timeout)
    if not alive and qmqpd is not None:       # last: qmail-send's bounces go through it
        alive = _terminate([qmqpd], args.timeout)
    if alive:
        print("qmailctl: still running after %g s: %s" % (
            args.timeout, " ".join(str(p.pid) for p in alive)), file=sys.stderr)
        return 1
    for name in (SEND_PID, SMTPD_PID, SUBMISSION_PID, QMQPD_PID):
        try:
            os.unlink(os.path.join(home, "log", name))
        except OSError:
            pass
    print("stopped")
    return 0


def _describe(proc):
    import psutil
    try:
        with proc.oneshot():
            # [python, script] for pip's scripts, [python, -IS, script] for HOME/bin's launchers
            name = os.path.basename(next((p for p in proc.cmdline()[1:3] if "qmail" in p),
                                         proc.name()))
            return "%-20s pid %-7d user %-10s up %d s" % (
                name, proc.pid, proc.username(), time.time() - proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "pid %d (gone)" % proc.pid


def stat(args):
    home = _home(args)
    if _not_a_home(home):
        return 1
    send = running_send(home)
    code = 0
    if send is None:
        print("qmail-send: not running")
        code = 1
    else:
        print(_describe(send))
        for child in send.children():
            print("  " + _describe(child))
    for listener in running_listeners(home):
        print(_describe(listener))
    qmqpd = running_qmqpd(home)
    print(_describe(qmqpd) if qmqpd is not None else "qmail-qmqpd: not running")
    from qmailpy.backends import open_backend
    try:
        total, todo = open_backend(home).counts()
        print("messages in queue: %d" % total)
        print("messages in queue but not yet preprocessed: %d" % todo)
    except Exception as e:          # a broken queue must not hide the daemons' state
        print("qmailctl: unable to count the queue: %s" % e, file=sys.stderr)
        code = 1
    return code


def _signal(args, signum, what):
    home = _home(args)
    send = running_send(home)
    if send is None:
        print("qmailctl: qmail-send is not running in %s" % home, file=sys.stderr)
        return 1
    send.send_signal(signum)
    print(what)
    return 0


def queue(args):
    home = _home(args)
    if _not_a_home(home):
        return 1
    env = _env(home)
    code = 0
    for prog in ("qmail-qread", "qmail-qstat"):
        try:
            code = subprocess.run([prog], env=env).returncode or code
        except OSError as e:
            print("qmailctl: cannot run %s: %s" % (prog, e.strerror), file=sys.stderr)
            code = 1
    return code


def run(args):
    command = args.command
    if command == "start":
        return start(args)
    if command == "stop":
        return stop(args)
    if command == "stat":
        return stat(args)
    if command == "doqueue":
        return _signal(args, signal.SIGALRM, "qmail-send: retrying every queued message now")
    if command == "reload":
        return _signal(args, signal.SIGHUP, "qmail-send: rereading locals and virtualdomains")
    if command == "queue":
        return queue(args)
    raise ValueError(command)

