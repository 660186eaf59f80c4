"""qmail-queue as a real process: the bytes it leaves, its exit codes, and what a failure leaves."""
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest
from inotify_simple import INotify, flags

from qmailpy import states
from qmailpy.layout import SPLIT
from qmailpy.queue.client import QueueClient
from queue_view import queued

AS_ROOT = os.geteuid() == 0
TIMEOUT = 30


def envelope(sender, recipients):
    return b"F" + sender + b"\0" + b"".join(b"T" + r + b"\0" for r in recipients) + b"\0"


def start(home, stdin=subprocess.PIPE, stdout=None, preexec_fn=None, env=None, argv=("qmail-queue",)):
    """qmail-queue with fd 0 = stdin and fd 1 = stdout (default: a pipe we return the write end of)."""
    env_w = None
    if stdout is None:
        env_r, env_w = os.pipe()
        stdout = env_r
    proc = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                            env=env or home.env, preexec_fn=preexec_fn)
    if env_w is not None:
        os.close(env_r)
    return proc, env_w


def feed(proc, env_w, message, env_bytes):
    try:
        proc.stdin.write(message)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    try:
        os.write(env_w, env_bytes)
    except BrokenPipeError:
        pass
    os.close(env_w)
    code = proc.wait(timeout=TIMEOUT)
    assert proc.stderr.read() == b""
    return code


def queue_files(home):
    """{kind: [relative paths]} of every file under the queue's message directories."""
    found = []
    for kind in ("pid", "mess", "intd", "todo", "info", "local", "remote", "bounce"):
        for root, dirs, files in os.walk(os.path.join(home.queue, kind)):
            found += [os.path.relpath(os.path.join(root, f), home.queue) for f in files]
    return sorted(found)


def message_states(home):
    """{n: state} from the files present, by states.classify."""
    present = {}
    for rel in queue_files(home):
        kind, name = rel.split("/")[0], rel.split("/")[-1]
        if kind == "pid":
            continue
        present.setdefault(int(name), set()).add(kind)
    return {n: states.classify(kinds) for n, kinds in present.items()}


def assert_only_leftovers(home):
    assert not os.listdir(os.path.join(home.queue, "todo"))
    for n, state in message_states(home).items():
        assert state in states.LEFTOVER_STATES, (n, state)


@pytest.mark.slow
def test_queues_message_with_received_line_and_todo(qmail_home):
    proc, env_w = start(qmail_home)
    code = feed(proc, env_w, b"Subject: hi\n\nbody\n", envelope(b"joe@a.example", [b"fred@b.example", b"x@c"]))
    assert code == 0
    files = queue_files(qmail_home)
    mess = [f for f in files if f.startswith("mess/")]
    assert len(mess) == 1
    n = int(mess[0].split("/")[2])
    assert mess[0] == "mess/%d/%d" % (n % 23, n)
    assert files == sorted(["mess/%d/%d" % (n % 23, n), "intd/%d" % n, "todo/%d" % n])
    st = os.stat(os.path.join(qmail_home.queue, mess[0]))
    assert st.st_ino == n and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == qmail_home.uid
    data = open(os.path.join(qmail_home.queue, mess[0]), "rb").read()
    first, rest = data.split(b"\n", 1)
    who = b"by uid 0" if AS_ROOT else b"by alias"      # non-root: the single user is every role
    assert re.fullmatch(rb"Received: \(qmail %d invoked %s\); \d{1,2} [A-Z][a-z]{2} \d{4} "
                        rb"\d\d:\d\d:\d\d -0000" % (proc.pid, who), first), first
    assert rest == b"Subject: hi\n\nbody\n"
    todo = open(os.path.join(qmail_home.queue, "todo/%d" % n), "rb").read()
    assert todo == b"u%d\0p%d\0Fjoe@a.example\0Tfred@b.example\0Tx@c\0" % (os.getuid(), proc.pid)
    assert os.stat(os.path.join(qmail_home.queue, "todo/%d" % n)).st_ino == \
        os.stat(os.path.join(qmail_home.queue, "intd/%d" % n)).st_ino
    assert message_states(qmail_home) == {n: states.S4}


@pytest.mark.slow
@pytest.mark.both_backends
def test_empty_recipient_list_is_legal(qmail_home):
    proc, env_w = start(qmail_home)
    assert feed(proc, env_w, b"x\n", b"F\0\0") == 0
    [m] = queued(qmail_home)
    assert (m.sender, m.recipients, m.uid) == (b"", [], os.getuid())


@pytest.mark.slow
@pytest.mark.both_backends
def test_large_message_and_many_recipients(qmail_home):
    message = b"".join(b"line %d %s\n" % (i, b"x" * 70) for i in range(5000))
    rcpts = [b"user%d@example.org" % i for i in range(3000)]
    qmail_home.control("maxrcpt", "3000\n")        # beyond the default 1000 (tests/test_queue_limits.py)
    proc, env_w = start(qmail_home)
    # The envelope is bigger than a pipe buffer: write it from a second process.
    writer = subprocess.Popen([sys.executable, "-c", "import os,sys; os.write(1, sys.stdin.buffer.read())"],
                              stdin=subprocess.PIPE, stdout=env_w)
    os.close(env_w)
    proc.stdin.write(message)
    proc.stdin.close()
    writer.communicate(envelope(b"s@x", rcpts), timeout=TIMEOUT)
    assert proc.wait(timeout=TIMEOUT) == 0
    [m] = queued(qmail_home)
    assert m.body_after_received(1) == message
    assert (m.sender, m.recipients) == (b"s@x", rcpts)


@pytest.mark.slow
@pytest.mark.parametrize("env_bytes, code, leftover", [
    (b"Fa@b\0Tc@d\0", 54, False),                  # no final NUL: read error, cleaned up
    (b"Fa@b\0Tc@d", 54, False),                    # EOF inside an address
    (b"", 54, False),                              # nothing at all
    (b"Ta@b\0\0", 91, True),                       # no F record
    (b"Fa@b\0Xc@d\0\0", 91, True),                 # bad record letter
    (b"F" + b"a" * 1003 + b"\0\0", 11, True),      # sender one byte over the limit
    (b"Fa@b\0T" + b"r" * 1003, 11, True),          # over the limit even before any NUL
    (b"Fa@b\0T" + b"r" * 1003 + b"\0\0", 11, True),
])
def test_bad_envelopes(qmail_home, env_bytes, code, leftover):
    proc, env_w = start(qmail_home)
    assert feed(proc, env_w, b"message\n", env_bytes) == code
    assert_only_leftovers(qmail_home)
    if leftover:                                   # qmail leaves S3 debris for the 36-hour cleanup
        assert set(message_states(qmail_home).values()) == {states.S3}
    else:                                          # 53/54 truncate and unlink what was made
        assert queue_files(qmail_home) == []


@pytest.mark.slow
def test_address_of_exactly_1002_bytes_is_accepted(qmail_home):
    proc, env_w = start(qmail_home)
    rcpt = b"r" * 1002
    assert feed(proc, env_w, b"m\n", envelope(b"s" * 1002, [rcpt])) == 0
    todo = [f for f in queue_files(qmail_home) if f.startswith("todo/")][0]
    assert open(os.path.join(qmail_home.queue, todo), "rb").read().endswith(b"T" + rcpt + b"\0")


def test_fd1_closed_is_a_read_error(qmail_home):
    proc = subprocess.Popen(["qmail-queue"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env=qmail_home.env, preexec_fn=lambda: os.close(1))
    proc.communicate(b"message\n", timeout=TIMEOUT)
    assert proc.returncode == 54
    assert queue_files(qmail_home) == []


def test_fd0_unreadable_is_a_read_error(qmail_home, tmp_path):
    target = tmp_path / "writeonly"
    target.write_bytes(b"")
    with open(target, "wb") as wo:
        proc, env_w = start(qmail_home, stdin=wo)
        os.write(env_w, envelope(b"a@b", [b"c@d"]))
        os.close(env_w)
        assert proc.wait(timeout=TIMEOUT) == 54
    assert queue_files(qmail_home) == []


def _chmod(path, mode):
    os.chmod(path, mode)


@pytest.mark.slow
@pytest.mark.parametrize("breakage, code, left", [
    ("nohome", 61, None),
    ("noqueue", 62, None),
    ("pid", 63, None),
    ("mess", 64, None),
    ("intd", 65, states.S2),
    ("todo", 66, states.S3),
    ("backend", 55, None),
])
def test_queue_directory_trouble(qmail_home, breakage, code, left):
    q = qmail_home.queue
    env = qmail_home.env
    if breakage == "backend":
        qmail_home.control("queuebackend", "tape\n")
    elif breakage == "nohome":
        env = dict(env, QMAILHOME=os.path.join(qmail_home.path, "nonexistent"))
    elif breakage == "noqueue":
        shutil.rmtree(q)
    elif breakage == "mess":
        for s in range(SPLIT):
            shutil.rmtree(os.path.join(q, "mess", str(s)))
    else:
        _chmod(os.path.join(q, breakage), 0o500)
    proc, env_w = start(qmail_home, env=env)
    assert feed(proc, env_w, b"m\n", envelope(b"a@b", [b"c@d"])) == code
    if breakage in ("pid", "intd", "todo"):
        _chmod(os.path.join(q, breakage), 0o700)
    if os.path.isdir(q):
        assert_only_leftovers(qmail_home)
        found = set(message_states(qmail_home).values())
        assert found == ({left} if left else set())


def test_disk_full_mid_message_is_a_write_error(qmail_home):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    # -B: the limit would also truncate the .pyc files Python writes while importing
    # (a 20,000-byte qmailqueue .pyc broke every later import of it)
    proc, env_w = start(qmail_home, preexec_fn=limit,
                        argv=(sys.executable, "-B", "-m", "qmailpy.cli.qmail_queue"))
    code = feed(proc, env_w, b"y" * 200000, envelope(b"a@b", [b"c@d"]))
    assert code == 53
    assert queue_files(qmail_home) == []


def _watch(paths, mask):
    ino = INotify()
    for p in paths:
        ino.add_watch(p, mask)
    return ino


def _wait_for(ino, predicate):
    while True:
        events = ino.read(timeout=TIMEOUT * 1000)
        assert events, "timed out waiting for qmail-queue"
        for ev in events:
            if predicate(ev):
                return ev


@pytest.mark.slow
def test_sigkill_while_reading_message_leaves_s2(qmail_home):
    messdirs = [os.path.join(qmail_home.queue, "mess", str(s)) for s in range(SPLIT)]
    ino = _watch(messdirs, flags.CREATE)
    proc, env_w = start(qmail_home)
    created = _wait_for(ino, lambda ev: ev.name.isdigit())
    n = int(created.name)
    ino2 = _watch([os.path.join(qmail_home.queue, "mess", str(n % 23), str(n))], flags.MODIFY)
    proc.stdin.write(b"z" * 100000)          # more than one buffer: written, then it reads again
    proc.stdin.flush()
    _wait_for(ino2, lambda ev: True)
    proc.kill()
    assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    os.close(env_w)
    assert set(message_states(qmail_home).values()) == {states.S2}
    assert_only_leftovers(qmail_home)


@pytest.mark.slow
def test_sigkill_while_reading_envelope_leaves_s3(qmail_home):
    ino = _watch([os.path.join(qmail_home.queue, "intd")], flags.CREATE)
    proc, env_w = start(qmail_home)
    proc.stdin.write(b"message\n")
    proc.stdin.close()
    os.write(env_w, b"Fa@b\0Tc@")
    _wait_for(ino, lambda ev: ev.name.isdigit())
    proc.kill()
    assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    os.close(env_w)
    assert set(message_states(qmail_home).values()) == {states.S3}
    assert_only_leftovers(qmail_home)


@pytest.mark.slow
def test_sigalrm_is_the_timeout_exit_52(qmail_home):
    ino = _watch([os.path.join(qmail_home.queue, "intd")], flags.CREATE)
    proc, env_w = start(qmail_home)
    proc.stdin.write(b"message\n")
    proc.stdin.close()
    _wait_for(ino, lambda ev: ev.name.isdigit())
    proc.send_signal(signal.SIGALRM)
    assert proc.wait(timeout=TIMEOUT) == 52
    os.close(env_w)
    assert set(message_states(qmail_home).values()) == {states.S3}     # no cleanup on timeout


@pytest.mark.slow
def test_ignored_signals_do_not_interrupt(qmail_home):
    ino = _watch([os.path.join(qmail_home.queue, "intd")], flags.CREATE)
    proc, env_w = start(qmail_home)
    proc.stdin.write(b"message\n")
    proc.stdin.close()
    _wait_for(ino, lambda ev: ev.name.isdigit())
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
        proc.send_signal(sig)
    os.write(env_w, envelope(b"a@b", [b"c@d"]))
    os.close(env_w)
    assert proc.wait(timeout=TIMEOUT) == 0
    assert set(message_states(qmail_home).values()) == {states.S4}


def _roles_file(home, **override):
    me = __import__("pwd").getpwuid(os.getuid()).pw_name
    other = "daemon" if me != "daemon" else "bin"
    roles = dict(alias=other, qmaild=other, qmaill=home.user, qmailp=home.user, qmailq=home.user,
                 qmailr=home.user, qmails=other, qmail=str(home.gid), nofiles=str(home.gid))
    roles.update({k: (me if v == "me" else v) for k, v in override.items()})
    home.control("roles", "".join("%s:%s\n" % kv for kv in roles.items()))


@pytest.mark.slow
@pytest.mark.parametrize("override, who", [
    (dict(alias="me"), b"by alias"),
    (dict(qmaild="me"), b"from network"),
    (dict(qmails="me"), b"for bounce"),
    ({}, b"by uid %d" % os.getuid()),
])
def test_received_line_names_the_caller(qmail_home, override, who):
    _roles_file(qmail_home, **override)
    proc, env_w = start(qmail_home)
    assert feed(proc, env_w, b"m\n", envelope(b"a@b", [b"c@d"])) == 0
    mess = [f for f in queue_files(qmail_home) if f.startswith("mess/")][0]
    first = open(os.path.join(qmail_home.queue, mess), "rb").readline()
    assert first.startswith(b"Received: (qmail %d invoked %s); " % (proc.pid, who))


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
def test_syscall_order_with_directory_fsyncs(qmail_home, tmp_path):
    log = tmp_path / "trace"
    # Message and envelope both arrive through pipes.
    env_r, env_w = os.pipe()
    proc = subprocess.Popen(["strace", "-f", "-qq", "-o", str(log), "-e",
                             "trace=openat,link,unlink,fsync,alarm,setitimer", "qmail-queue"],
                            stdin=subprocess.PIPE, stdout=env_r, env=qmail_home.env)
    os.close(env_r)
    proc.stdin.write(b"m\n")
    proc.stdin.close()
    os.write(env_w, envelope(b"a@b", [b"c@d"]))
    os.close(env_w)
    code = proc.wait(timeout=TIMEOUT)
    if code != 0 and "qmail-queue" not in log.read_text(errors="replace"):
        pytest.skip("strace cannot trace here")
    assert code == 0
    steps = []
    fds = {}
    for line in log.read_text().splitlines():
        m = re.search(r'openat\(AT_FDCWD, "((?:pid|mess|intd|todo)[^"]*)".*= (\d+)$', line)
        if m:
            fds[m.group(2)] = m.group(1)
            steps.append("open " + re.sub(r"\d+", "N", m.group(1)))
            continue
        m = re.search(r'(link|unlink)\("([^"]+)"(?:, "([^"]+)")?\)\s+= 0', line)
        if m and m.group(2).startswith(("pid/", "intd/", "mess/")):
            steps.append(" ".join(re.sub(r"\d+", "N", x) for x in m.groups() if x))
            continue
        m = re.search(r"fsync\((\d+)\)\s+= 0", line)
        if m and m.group(1) in fds:
            steps.append("fsync " + re.sub(r"\d+", "N", fds[m.group(1)]))
            continue
        m = re.search(r"alarm\((\d+)\)|setitimer\(ITIMER_REAL, \{it_interval=\{tv_sec=0, tv_usec=0\}, "
                      r"it_value=\{tv_sec=(\d+),", line)
        if m:
            steps.append("alarm %s" % (m.group(1) or m.group(2)))
    assert steps == [
        "alarm 86400",                      # the 24-hour self-timer, before any file is touched
        "open pid/N.N.N", "link pid/N.N.N mess/N/N", "unlink pid/N.N.N",
        "fsync pid/N.N.N", "open mess/N", "fsync mess/N",
        "open intd/N", "fsync intd/N", "link intd/N todo/N", "open todo", "fsync todo",
    ]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
@pytest.mark.parametrize("nth, what, code, left", [
    (1, "the message file", 53, None),
    (2, "mess/S", 53, None),
    (3, "intd/n", 53, None),
    (4, "todo/", 66, states.S3),
])
def test_fsync_failure_at_each_sync(qmail_home, nth, what, code, left):
    """EIO from the nth fsync (strace's fault injection): qmail-queue's documented exit code,
    todo/n never left behind, only what S2/S3 allow."""
    env_r, env_w = os.pipe()
    proc = subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync",
                             "-e", "inject=fsync:error=EIO:when=%d" % nth, "qmail-queue"],
                            stdin=subprocess.PIPE, stdout=env_r, stderr=subprocess.PIPE, env=qmail_home.env)
    os.close(env_r)
    assert feed(proc, env_w, b"m\n", envelope(b"a@b", [b"c@d"])) == code, what
    assert_only_leftovers(qmail_home)
    assert set(message_states(qmail_home).values()) == ({left} if left else set())


@pytest.mark.slow
def test_leftovers_of_failed_queueing_are_removed_by_the_36_hour_cleanup(qmail_home):
    """A 91 (no F) leaves S3 and a 65 (intd/ unwritable) leaves S2; aged past 36 hours,
    qmail-send's cleanup has qmail-clean remove them, and nothing else."""
    from send_harness import Daemons, wait_gone
    proc, env_w = start(qmail_home)
    assert feed(proc, env_w, b"m\n", b"Xa@b\0\0") == 91
    intd = os.path.join(qmail_home.queue, "intd")
    os.chmod(intd, 0o500)
    proc, env_w = start(qmail_home)
    assert feed(proc, env_w, b"m\n", envelope(b"a@b", [b"c@d"])) == 65
    os.chmod(intd, 0o700)
    left = message_states(qmail_home)
    assert sorted(left.values()) == [states.S2, states.S3]
    assert qmail_home.queue_message(b"fresh\n", b"a@b", [b"defer@far.example"]).returncode == 0
    fresh = [n for n, st in message_states(qmail_home).items() if st == states.S4]
    old = time.time() - states.LEFTOVER_AGE - 60
    for n in left:
        path = os.path.join(qmail_home.queue, "mess", str(n % SPLIT), str(n))
        os.utime(path, (old, old))
    d = Daemons(qmail_home, fake=True)
    try:
        d.start()
        d.wait_started()
        for n in left:
            wait_gone(os.path.join(qmail_home.queue, "mess", str(n % SPLIT), str(n)))
        assert not os.listdir(intd)
    finally:
        d.kill()
    assert list(message_states(qmail_home)) == fresh          # the young one (deferred) stays


# --- the injector side: qmailpy.queue.client ---------------------------------

def _in_home(home, fn):
    """Run fn in a child process with the home's environment (QueueClient forks; keep pytest clean)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.environ.clear()
            os.environ.update(home.env)
            result = fn()
            os.write(w, repr(result).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return eval(data.decode())


def _client(home, message, sender, rcpts, environ=None):
    def go():
        qq = QueueClient(home.path, environ=environ)
        qq.write(message)
        res = qq.finish(sender, rcpts)
        return (res.code, res.pid, res.ok, res.permanent, res.text)
    return _in_home(home, go)


@pytest.mark.slow
def test_client_queues_in_a_forked_child(qmail_home):
    code, pid, ok, permanent, text = _client(qmail_home, b"hello\n", b"a@b", [b"c@d"])
    assert (code, ok, permanent, text) == (0, True, False, b"")
    mess = [f for f in queue_files(qmail_home) if f.startswith("mess/")][0]
    assert open(os.path.join(qmail_home.queue, mess), "rb").readline().startswith(
        b"Received: (qmail %d invoked " % pid)
    todo = [f for f in queue_files(qmail_home) if f.startswith("todo/")][0]
    assert b"\0p%d\0" % pid in open(os.path.join(qmail_home.queue, todo), "rb").read()


def test_client_starts_no_program_without_qmailqueue(qmail_home):
    """sendmail, qmail-smtpd, bounces and forwards queue through QueueClient: with
    QMAILQUEUE unset it must not exec anything (no interpreter start per message)."""
    def go():
        def refuse(*args, **kwargs):
            raise OSError(1, "exec refused by the test")
        for name in ("execv", "execve", "execvp", "execvpe", "execl", "execlp", "posix_spawn",
                     "posix_spawnp"):
            setattr(os, name, refuse)
        qq = QueueClient(qmail_home.path, environ={})
        qq.write(b"no exec\n")
        res = qq.finish(b"a@b", [b"c@d"])
        return (res.code, res.ok)
    assert _in_home(qmail_home, go) == (0, True)
    assert [m.recipients for m in queued(qmail_home)] == [[b"c@d"]]


def test_client_reports_envelope_trouble(qmail_home):
    code, _, ok, permanent, text = _client(qmail_home, b"m\n", b"a" * 2000, [b"c@d"])
    assert (code, ok, permanent, text) == (11, False, True, b"envelope address too long for qq (#5.1.3)")


def _script(tmp_path, body):
    path = tmp_path / "fakeqq"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    if AS_ROOT:
        os.chmod(tmp_path, 0o755)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("body, code, permanent, text", [
    ("cat >/dev/null; exit 31", 31, True, b"mail server permanently rejected message (#5.3.0)"),
    ("cat >/dev/null; exit 71", 71, False, b"mail server temporarily rejected message (#4.3.0)"),
    ("cat >/dev/null; printf 'Dno thanks (#5.7.1)' >&6; exit 82", 82, True, b"no thanks (#5.7.1)"),
    ("cat >/dev/null; printf 'Z' >&6; exit 82", 82, False, b"qq temporary problem (#4.3.0)"),
    ("cat >/dev/null; exit 25", 25, True, b"qq permanent problem (#5.3.0)"),
    ("cat >/dev/null; exit 99", 99, False, b"qq temporary problem (#4.3.0)"),
    ("cat >/dev/null; kill -9 $$", None, False, b"qq crashed (#4.3.0)"),
    # verbatim exec in QMAILHOME, message on fd 0, envelope on fd 1
    ('exec 3<&1; test "$(pwd -P)" = "$(cd "$QMAILHOME" && pwd -P)" || exit 61; test "$(cat)" = m || exit 62;'
     ' test "$(od -An -c <&3 | tr -d " \\n")" = "Fa@b\\0Tc@d\\0\\0" || exit 63', 0, False, b""),
])
def test_client_runs_qmailqueue_verbatim(qmail_home, tmp_path, body, code, permanent, text):
    environ = dict(qmail_home.env, QMAILQUEUE=_script(tmp_path, body))
    got = _client(qmail_home, b"m\n", b"a@b", [b"c@d"], environ=environ)
    assert (got[0], got[3], got[4]) == (code, permanent, text)


@pytest.mark.slow
def test_client_exec_failure_is_120(qmail_home, tmp_path):
    environ = dict(qmail_home.env, QMAILQUEUE=str(tmp_path / "missing"))
    got = _client(qmail_home, b"m\n", b"a@b", [b"c@d"], environ=environ)
    assert (got[0], got[3], got[4]) == (120, False, b"unable to exec qq (#4.3.0)")


def test_client_write_error_is_qq_read_error(qmail_home, tmp_path):
    environ = dict(qmail_home.env, QMAILQUEUE=_script(tmp_path, "exit 0"))
    got = _client(qmail_home, b"x" * 1000000, b"a@b", [b"c@d"], environ=environ)
    assert (got[0], got[2], got[4]) == (0, False, b"qq read error (#4.3.0)")


def test_client_abort_queues_nothing(qmail_home):
    def go():
        qq = QueueClient(qmail_home.path)
        qq.write(b"half a message")
        res = qq.abort()
        return (res.code, res.text)
    assert _in_home(qmail_home, go) == (54, b"qq read error (#4.3.0)")
    assert queue_files(qmail_home) == []


def test_two_clients_at_once_do_not_deadlock(qmail_home):
    def go():
        a = QueueClient(qmail_home.path)
        b = QueueClient(qmail_home.path)
        a.write(b"first\n")
        b.write(b"second\n")
        ra = a.finish(b"a@b", [b"1@x"])
        rb = b.finish(b"a@b", [b"2@x"])
        return (ra.code, rb.code)
    assert _in_home(qmail_home, go) == (0, 0)
    assert sorted(message_states(qmail_home).values()) == [states.S4, states.S4]


# SIGKILL injected (by strace) on entry to each system call of the queueing sequence,
# so the call never runs. Python's start-up makes none of these calls.
KILL_POINTS = [
    ("link", 1, set()),                 # pid/ -> mess/: only the pid/ scratch file exists
    ("unlink", 1, {states.S2}),         # removing the pid/ name
    ("write", 1, {states.S2}),          # writing the message
    ("fsync", 1, {states.S2}),          # syncing the message
    ("fsync", 2, {states.S2}),          # syncing mess/S
    ("write", 2, {states.S3}),          # writing the envelope to intd/
    ("fsync", 3, {states.S3}),          # syncing intd/
    ("link", 2, {states.S3}),           # intd/ -> todo/
]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
@pytest.mark.parametrize("syscall, when, left", KILL_POINTS)
def test_sigkill_at_each_step(qmail_home, tmp_path, syscall, when, left):
    (tmp_path / "m").write_bytes(b"message\n")
    (tmp_path / "e").write_bytes(envelope(b"a@b", [b"c@d"]))
    with open(tmp_path / "m", "rb") as m, open(tmp_path / "e", "rb") as e:
        done = subprocess.run(["strace", "-qq", "-o", os.devnull, "-e", "trace=" + syscall,
                               "-e", "inject=%s:signal=KILL:when=%d" % (syscall, when), "qmail-queue"],
                              stdin=m, stdout=e, stderr=subprocess.PIPE, env=qmail_home.env, timeout=TIMEOUT)
    if b"ptrace" in done.stderr:
        pytest.skip("strace cannot trace here: %s" % done.stderr.decode(errors="replace"))
    assert done.returncode != 0
    assert set(message_states(qmail_home).values()) == left
    assert_only_leftovers(qmail_home)
    pids = os.listdir(os.path.join(qmail_home.queue, "pid"))
    assert len(pids) == (1 if (syscall, when) in (("link", 1), ("unlink", 1)) else 0)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
def test_sigkill_after_todo_link_leaves_a_complete_message(qmail_home, tmp_path):
    """The last sync (todo/) comes after the link: a kill there leaves the message queued, whole."""
    (tmp_path / "m").write_bytes(b"message\n")
    (tmp_path / "e").write_bytes(envelope(b"a@b", [b"c@d"]))
    with open(tmp_path / "m", "rb") as m, open(tmp_path / "e", "rb") as e:
        subprocess.run(["strace", "-qq", "-o", os.devnull, "-e", "trace=fsync",
                        "-e", "inject=fsync:signal=KILL:when=4", "qmail-queue"],
                       stdin=m, stdout=e, stderr=subprocess.PIPE, env=qmail_home.env, timeout=TIMEOUT)
    [(n, state)] = message_states(qmail_home).items()
    assert state == states.S4
    todo = open(os.path.join(qmail_home.queue, "todo", str(n)), "rb").read()
    assert todo.endswith(b"\0Fa@b\0Tc@d\0")
