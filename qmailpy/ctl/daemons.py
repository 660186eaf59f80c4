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
        every submitter without queue rights queues; with --qmqp HOST:PORT it
        also answers QMQP there (qmail-qmqpd --tcp: a hub for null clients).
        Start may be run again at any time (after a crash, from cron): it starts
        only what is missing and says what already runs, finding a daemon of the
        home by its pid file or, when that is gone, by its command line and
        environment (QMAILHOME; SMTPAUTH=! for the submission listener), and
        only a process running as root, the caller or the daemon's own account
        (trusted_uids: anyone can fake a command line and environment). When
        something fails to start it stops what this call started and nothing else.
stop    SIGTERM to qmail-send (and the SMTP listeners), then waits until they
        and qmail-send's helpers are gone; then stops qmail-qmqpd.
stat    the daemons (psutil) and the queue counts; exit 1 when one is down.
        A mini-qmail home (qmailctl init --mini) runs no daemons: start (without
        --smtp or --submission, which need a queue) and stat say so and exit 0.
doqueue SIGALRM: every queued message is retried now.
reload  SIGHUP: qmail-send rereads locals and virtualdomains.
queue   qmail-qread, then qmail-qstat.
"""
import os
import signal
from stat import S_ISREG
import subprocess
import sys
import time

from qmailpy.logfiles import LOG_DIR, QMQPD_LOG, SEND_LOG, SMTPD_LOG, SUBMISSION_LOG, log_set

HELP = "run the daemons of a home (start, stop, stat, doqueue, reload, queue)"
SEND_PID = "qmail-send.pid"
SMTPD_PID = "qmail-smtpd.pid"
QMQPD_PID = "qmail-qmqpd.pid"
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
        parser.add_argument("--qmqp", metavar="HOST:PORT",
                            help="qmail-qmqpd also answers QMQP on HOST:PORT (a hub for"
                                 " null clients, control/qmqpclients)")
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
    path = os.path.join(home, LOG_DIR)
    os.makedirs(path, mode=0o755, exist_ok=True)
    return path


def _env(home):
    """The daemons' environment: QMAILHOME, and a PATH on which qmail-start is found:
    HOME/bin first when `qmailctl init` wrote the programs there (as qmail's rc does)
    and _bin_is_roots allows it; without $QMAILHOLD and $QMAILNOTBEFORE."""
    import shutil
    from qmailpy.home import BIN
    from qmailpy.mess import HOLD, NOT_BEFORE
    env = dict(os.environ)
    env["QMAILHOME"] = home
    # one submission's requests (qmail-queue(8)): left in the shell that starts the daemons,
    # they would hold every message qmail-smtpd queues, and qmail-send's bounces
    for name in (HOLD, NOT_BEFORE):
        env.pop(name, None)
    path = env.get("PATH", "/usr/bin:/bin")
    bindir = os.path.join(home, BIN)
    trusted = os.geteuid() != 0 or _bin_is_roots(home)
    if not trusted:                 # not even where the caller's PATH names it
        path = os.pathsep.join(d for d in path.split(os.pathsep)
                               if not d or os.path.abspath(d) != bindir)
    if shutil.which("qmail-start", path=path) is None:
        path = os.path.dirname(sys.executable) + os.pathsep + path
    if trusted and os.path.isdir(bindir):
        path = bindir + os.pathsep + path
    env["PATH"] = path
    return env


def _bin_is_roots(home):
    """Whether root may run HOME/bin's programs: bin/ and everything in it root's and
    writable by no one else. A single-user home's bin/ and launchers are its user's,
    who could rewrite qmail-start and so run anything as root; root then runs the
    daemons from PATH or its own installation (the directory of sys.executable)."""
    import stat
    from qmailpy import nofollow
    from qmailpy.home import BIN
    try:
        dfd = nofollow.open_path(home, BIN)
    except OSError:
        return False
    try:
        for st in [os.fstat(dfd)] + [os.stat(name, dir_fd=dfd, follow_symlinks=False) for name in os.listdir(dfd)]:
            if st.st_uid != 0 or st.st_mode & 0o022 or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                return False
    except OSError:
        return False
    finally:
        os.close(dfd)
    return True


def _read_pid(home, name):
    """The pid in HOME/log/name, or None. Read through log/'s descriptor (nofollow): in a
    single-user home log/ may be its user's, who could put a FIFO there (root's read
    would wait for ever) or a link to a file of root's."""
    from qmailpy import nofollow
    try:
        dfd = nofollow.open_path(home, LOG_DIR)
        try:
            fd = nofollow.open_file(name, dfd)
        finally:
            os.close(dfd)
        with os.fdopen(fd, "rb") as f:
            return int(f.read(64).split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Daemon:
    """One daemon qmailctl runs: its program (the name in its command line), its log and
    pid file in HOME/log, the log line that says it is up, and for the two listeners
    whether it is the submission one (SMTPAUTH=! in its environment)."""

    def __init__(self, label, program, logname, pidname, ready, role, submission=None):
        self.label, self.program, self.logname, self.pidname = label, program, logname, pidname
        self.ready, self.role, self.submission = ready, role, submission


# role: the account the daemon switches to once started by root (privs.become, smtpd.privileges.drop)
QMQPD = Daemon("qmail-qmqpd", "qmail-qmqpd", QMQPD_LOG, QMQPD_PID, b"listening on", "qmailq")
SEND = Daemon("qmail-send", "qmail-send", SEND_LOG, SEND_PID, b"status: local", "qmails")
SMTPD = Daemon("qmail-smtpd-listen (smtp)", "qmail-smtpd-listen", SMTPD_LOG, SMTPD_PID,
               b"listening on", "qmaild", submission=False)
SUBMISSION = Daemon("qmail-smtpd-listen (submission)", "qmail-smtpd-listen", SUBMISSION_LOG,
                    SUBMISSION_PID, b"listening on", "qmaild", submission=True)
DAEMONS = (QMQPD, SEND, SMTPD, SUBMISSION)


def _names_program(cmdline, program):
    """True for a Python running program: [python, script] (pip's scripts) or [python, -IS,
    script] (HOME/bin's launchers). Not for another program that names it, such as
    daemontools' `supervise qmail-send`."""
    if not cmdline or not os.path.basename(cmdline[0]).startswith("python"):
        return False
    script = next((part for part in cmdline[1:3] if not part.startswith("-")), "")
    return os.path.basename(script) == program


def trusted_uids(home):
    """{role: the uids a process of that role's daemon may run as}: root (before the
    switch), the role's account, and the caller. Any other account could have given its
    own process the daemon's command line and QMAILHOME (and rewrite them at will): root
    must neither signal nor adopt a process another account controls."""
    from qmailpy import privs
    try:
        uids = privs.role_uids(home, {d.role for d in DAEMONS})
    except (OSError, privs.PrivError):
        uids = {}
    return {d.role: {0, os.geteuid()} | ({uids[d.role]} if d.role in uids else set()) for d in DAEMONS}


def _is(proc, daemon, home, unreadable_env_ok, trusted):
    """True when proc is daemon of this home. Every uid of it (real, effective, saved)
    must be one of trusted[daemon.role]. Its environment says which home (QMAILHOME) and
    which listener (SMTPAUTH); another account's environment cannot be read: then proc
    counts only when unreadable_env_ok (its pid came from our pid file)."""
    import psutil
    try:
        if proc.status() == psutil.STATUS_ZOMBIE or not _names_program(proc.cmdline(), daemon.program):
            return False
        if not set(proc.uids()) <= trusted[daemon.role]:
            return False
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    try:
        env = proc.environ()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return unreadable_env_ok
    if not env:                 # a kernel that hides it, or an exec in progress
        return unreadable_env_ok
    if os.path.abspath(env.get("QMAILHOME", "/var/qmail")) != home:
        return False
    return daemon.submission is None or (env.get("SMTPAUTH") == "!") == daemon.submission


def find(home, daemon, everyone=None, trusted=None):
    """The running daemon of this home: the process its pid file names, else one found
    among every process (a pid file removed, or a start that lost track of it); only
    a process of an account trusted_uids allows."""
    import psutil
    trusted = trusted or trusted_uids(home)
    pid = _read_pid(home, daemon.pidname)
    if pid is not None:
        try:
            proc = psutil.Process(pid)
            if _is(proc, daemon, home, True, trusted):
                return proc
        except psutil.NoSuchProcess:
            pass
    for proc in (everyone if everyone is not None else psutil.process_iter()):
        if proc.pid != os.getpid() and _is(proc, daemon, home, False, trusted):
            return proc
    return None


def find_all(home):
    """{daemon: process or None} for every daemon, with one walk of the process table."""
    import psutil
    everyone = list(psutil.process_iter())
    trusted = trusted_uids(home)
    return {daemon: find(home, daemon, everyone, trusted) for daemon in DAEMONS}


def running_send(home):
    return find(home, SEND)


def _log_positions(logdir, logname):
    """{inode: size} of the log's files now: what is written later is past these."""
    positions = {}
    for path in log_set(logdir, logname):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        positions[st.st_ino] = st.st_size
    return positions


def _written_since(logdir, logname, positions):
    """What the log's files hold beyond positions: a file rotated away counts from
    where it was, a file new since then (a rotation, even on the first line) whole."""
    chunks = []
    for path in log_set(logdir, logname):
        try:
            # a FIFO or link planted under a log name is skipped, never waited on (docs/security.md)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not S_ISREG(st.st_mode):
                continue
            f.seek(positions.get(st.st_ino, 0))
            chunks.append(f.read())
    return b"".join(chunks)


def _wait_ready(logdir, daemon, positions, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if daemon.ready in _written_since(logdir, daemon.logname, positions):
            return True
        if proc.poll() is not None:
            return daemon.ready in _written_since(logdir, daemon.logname, positions)
        time.sleep(0.05)
    return False


def _start_one(home, logdir, env, daemon, argv):
    """Start daemon and wait until its log says it is up: its Popen, or None (and why,
    on stderr, with the daemon stopped again)."""
    positions = _log_positions(logdir, daemon.logname)
    logpath = os.path.join(logdir, daemon.logname)
    started = _spawn_recorded(argv, env, logpath, daemon.pidname)
    if started is None:
        return None
    proc, writer = started
    if not _wait_ready(logdir, daemon, positions, proc, START_TIMEOUT):
        what = " ".join(argv) if daemon.submission is not None else daemon.program
        print("qmailctl: %s did not start:\n%s" % (
            what, _written_since(logdir, daemon.logname, positions).decode("utf-8", "replace")),
            file=sys.stderr)
        _stop_spawned(proc, writer)
        _remove_pid(home, daemon, proc.pid)
        return None
    return proc


def _remove_pid(home, daemon, pid=None):
    """Remove daemon's pid file (only if it names pid, when pid is given)."""
    from qmailpy import nofollow
    if pid is not None and _read_pid(home, daemon.pidname) != pid:
        return
    try:
        dfd = nofollow.open_path(home, LOG_DIR)
    except OSError:
        return
    try:
        os.unlink(daemon.pidname, dir_fd=dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _spawn_logged(argv, env, logpath, cwd="/"):
    """Start argv in its own session with stdout/stderr through a log writer; its pid."""
    log_r, log_w = os.pipe()
    from qmailpy.ctl.logwriter import limits
    size, count = limits(env["QMAILHOME"])
    control = os.path.join(env["QMAILHOME"], "control")       # a changed logsize counts at once
    writer = subprocess.Popen([sys.executable, "-m", "qmailpy.ctl.logwriter", logpath, str(size), str(count),
                               control],
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
    """path holds pid whole or not at all: a full disk must not leave an empty pid file.
    Written with nofollow.replace through the directory's descriptor: root follows no
    link and opens no file its owner put there."""
    from qmailpy import nofollow
    directory, name = os.path.split(path)
    dfd = nofollow.open_home(directory)
    try:
        nofollow.replace(dfd, name, b"%d\n" % pid, 0o644)
    finally:
        os.close(dfd)


def _spawn_recorded(argv, env, logpath, pidname):
    """_spawn_logged, then the pid in HOME/log/pidname: (process, log writer); when the
    pid cannot be written (a full disk), the daemon is stopped, and None."""
    proc, writer = _spawn_logged(argv, env, logpath)
    path = os.path.join(os.path.dirname(logpath), pidname)
    try:
        _write_pid(path, proc.pid)
    except OSError as e:
        _stop_spawned(proc, writer)
        print("qmailctl: cannot write %s: %s; %s stopped" % (path, e.strerror, argv[0]), file=sys.stderr)
        return None
    return proc, writer


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


def _mini(home):
    """True when home is a mini-qmail home (qmailctl init --mini): no queue, no daemons."""
    from qmailpy.home import mini_queue
    return mini_queue(home) is not None


MINI_SAYS = ("%s is a mini-qmail home: no queue and no daemons; qmail-queue hands each message"
             " to the hubs in control/qmqpservers")


def _not_a_home(home):
    """True (after saying so on stderr) when home has no queue/ or control/me."""
    if os.path.isdir(os.path.join(home, "queue")) and os.path.isfile(os.path.join(home, "control", "me")):
        return False
    if _mini(home):
        print("qmailctl: " + MINI_SAYS % home, file=sys.stderr)
        return True
    print("qmailctl: %s is not a qmail home (make one with: qmailctl init --home %s)" % (home, home),
          file=sys.stderr)
    return True


LOCK = "qmailctl.lock"


def _lock(home, create=True):
    """One start or stop at a time per home: an exclusive lock on HOME/log/qmailctl.lock,
    reached through log/'s descriptor (root in a single-user home, whose log/ its user
    owns, follows no link and opens no FIFO planted there). Without create (stop), a lock
    file this account cannot make or open is no lock: None. Mode 0600: flock needs only
    a descriptor, so a lock every local user could open, any of them could hold, and
    root's start and stop would wait for ever."""
    import fcntl
    from qmailpy import nofollow
    try:
        dfd = nofollow.open_path(home, LOG_DIR)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        try:
            fd = nofollow.open_file(LOCK, dfd, os.O_WRONLY | os.O_CREAT, mode=0o600)
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.fchmod(fd, 0o600)            # made 0644 by an earlier qmailctl
        except PermissionError:
            if create:
                raise
            try:
                fd = nofollow.open_file(LOCK, dfd)
            except OSError:
                return None
    finally:
        os.close(dfd)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def start(args):
    """Start what is missing, say what already runs; on a failure, stop only what this
    call started: a start run again after a crash never takes down a healthy daemon."""
    home = _home(args)
    if _mini(home):
        if args.smtp or args.submission or args.qmqp:
            print("qmailctl: --smtp, --submission and --qmqp need a queue to feed: "
                  + MINI_SAYS % home, file=sys.stderr)
            return 1
        print("qmailctl: nothing to start: " + MINI_SAYS % home)
        return 0
    if _not_a_home(home):
        return 1
    try:
        logdir = _logdir(home)
        lock = _lock(home)
    except OSError as e:
        print("qmailctl: cannot use %s/log: %s" % (home, e.strerror or e), file=sys.stderr)
        return 1
    try:
        return _start_missing(home, logdir, args)
    finally:
        os.close(lock)


def _start_missing(home, logdir, args):
    env = _env(home)
    qmqpd = ["qmail-qmqpd"] + (["--tcp", args.qmqp] if getattr(args, "qmqp", None) else [])
    wanted = [(QMQPD, env, qmqpd),          # first: qmail-send's bounces go through it
              (SEND, env, ["qmail-start", args.defaultdelivery])]
    if args.smtp:
        wanted.append((SMTPD, env, ["qmail-smtpd-listen", args.smtp]))
    if args.submission:
        for name in ("servercert.pem", "checkpassword"):
            if not os.path.exists(os.path.join(home, "control", name)):
                print("qmailctl: warning: no control/%s: the submission port cannot offer AUTH,"
                      " so it takes no mail" % name, file=sys.stderr)
        wanted.append((SUBMISSION, dict(env, SMTPAUTH="!"), ["qmail-smtpd-listen", args.submission]))
    running = find_all(home)
    started = []
    refused = False
    for daemon, daemon_env, argv in wanted:
        proc = running[daemon]
        if proc is not None:
            listener = daemon is QMQPD or daemon.submission is not None
            if listener and not _runs_with(proc, argv[1:]):
                print("qmailctl: %s already running (pid %d), but not with %s: run qmailctl stop"
                      " first" % (daemon.label, proc.pid, " ".join(argv[1:])), file=sys.stderr)
                refused = True
                continue
            print("%s already running (pid %d)" % (daemon.label, proc.pid))
            if _read_pid(home, daemon.pidname) != proc.pid:
                _restore_pid(logdir, daemon, proc.pid)
            continue
        proc = _start_one(home, logdir, daemon_env, daemon, argv)
        if proc is None:
            _stop_these(home, started)
            return 1
        started.append((daemon, proc))
        where = " on %s" % argv[1] if daemon.submission is not None else ""
        print("%s started%s (pid %d), log %s" % (daemon.program, where, proc.pid,
                                                 os.path.join(logdir, daemon.logname)))
    return 1 if refused else 0


def _runs_with(proc, wanted_args):
    """Whether a running listener's command line ends with the arguments a start asks for
    (its address, qmail-qmqpd's --tcp): one already listening elsewhere is not it."""
    import psutil
    if not wanted_args:
        return True
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return True             # gone or unreadable: the start's other checks say so
    return cmdline[-len(wanted_args):] == list(wanted_args)


def _restore_pid(logdir, daemon, pid):
    path = os.path.join(logdir, daemon.pidname)
    try:
        _write_pid(path, pid)
        print("qmailctl: %s restored" % path)
    except OSError as e:
        print("qmailctl: cannot write %s: %s" % (path, e.strerror), file=sys.stderr)


def _stop_these(home, started):
    """Stop the daemons this start began (qmail-qmqpd last: qmail-send's bounces go through it)."""
    import psutil
    for group in ([(d, p) for d, p in started if d is not QMQPD], [(d, p) for d, p in started if d is QMQPD]):
        procs = []
        for daemon, proc in group:
            try:
                ps = psutil.Process(proc.pid)
                procs += [ps] + ps.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        for left in _terminate(procs, START_TIMEOUT):
            try:
                left.kill()
            except psutil.NoSuchProcess:
                pass
        for daemon, proc in group:
            proc.wait()
            _remove_pid(home, daemon, proc.pid)
            print("%s stopped again" % daemon.label)


def _terminate(procs, timeout):
    """SIGTERM to each; those still alive after timeout. A process of another account
    raises PermissionError with a message that says so."""
    import psutil
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            raise PermissionError("permission denied: %s (pid %d) runs as another account; "
                                  "run qmailctl as root or as that account" % (_name(proc), proc.pid))
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


def _name(proc):
    import psutil
    try:
        return os.path.basename(next((p for p in proc.cmdline()[:3] if "qmail" in p), proc.name()))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "process"


def stop(args):
    home = _home(args)
    logdir = os.path.join(home, LOG_DIR)
    try:
        lock = _lock(home, create=False)
    except OSError as e:
        print("qmailctl: cannot use %s: %s" % (logdir, e.strerror or e), file=sys.stderr)
        return 1
    try:
        return _stop_all(home, args.timeout)
    except PermissionError as e:
        print("qmailctl: %s" % e, file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            os.close(lock)


def _stop_all(home, timeout):
    import psutil
    running = find_all(home)
    if not any(running.values()):
        for daemon in DAEMONS:
            _remove_pid(home, daemon)
        print("qmailctl: nothing is running in %s" % home)
        return 0
    send = running[SEND]
    procs = [p for d, p in running.items() if p is not None and d is not QMQPD]
    helpers = []
    if send is not None:
        try:
            helpers = send.children()
        except psutil.NoSuchProcess:
            pass
    alive = _terminate(procs, timeout)
    if not alive:
        _, alive = psutil.wait_procs(helpers, timeout=timeout)
    if not alive and running[QMQPD] is not None:       # last: qmail-send's bounces go through it
        alive = _terminate([running[QMQPD]], timeout)
    if alive:
        print("qmailctl: still running after %g s: %s" % (
            timeout, " ".join(str(p.pid) for p in alive)), file=sys.stderr)
        return 1
    for daemon in DAEMONS:
        _remove_pid(home, daemon)
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
    """Each daemon, qmail-send's helpers and the queue counts; exit 1 when qmail-send or
    qmail-qmqpd is down, or a listener whose pid file remains (it was started and has
    not been stopped) is gone."""
    home = _home(args)
    if _mini(home):
        from qmailpy.home import control_list
        print(MINI_SAYS % home + ": " + " ".join(
            hub.decode("utf-8", "replace") for hub in control_list(home, "qmqpservers", [])))
        return 0
    if _not_a_home(home):
        return 1
    running = find_all(home)
    code = 0
    for daemon in DAEMONS:
        proc = running[daemon]
        if proc is not None:
            print(_describe(proc))
            if daemon is SEND:
                for child in _children(proc):
                    print("  " + _describe(child))
        elif daemon.submission is None:
            print("%s: not running" % daemon.label)
            code = 1
        elif _read_pid(home, daemon.pidname) is not None:
            print("%s: not running (log/%s names pid %d; qmailctl start starts it again)" % (
                daemon.label, daemon.pidname, _read_pid(home, daemon.pidname)))
            code = 1
    from qmailpy.backends import open_backend
    try:
        total, todo = open_backend(home).counts()
        print("messages in queue: %d" % total)
        print("messages in queue but not yet preprocessed: %d" % todo)
    except Exception as e:          # a broken queue must not hide the daemons' state
        print("qmailctl: unable to count the queue: %s" % e, file=sys.stderr)
        code = 1
    return code


def _children(proc):
    import psutil
    try:
        return proc.children()
    except psutil.NoSuchProcess:
        return []


def _signal(args, signum, what):
    home = _home(args)
    send = running_send(home)
    if send is None:
        print("qmailctl: qmail-send is not running in %s" % home, file=sys.stderr)
        return 1
    import psutil
    try:
        send.send_signal(signum)
    except psutil.AccessDenied:
        print("qmailctl: permission denied: qmail-send (pid %d) runs as another account;"
              " run qmailctl as root or as that account" % send.pid, file=sys.stderr)
        return 1
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

