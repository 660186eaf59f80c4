"""Root never works by path where another account can write (docs/security.md): run as root only.

The home is the suite's single-user home of `nobody`, so every directory in it is
nobody's, as run/ and queue/lock/ are qmailq's and queue/command/ qmails' on a real
server. The attacker's moves run as nobody (a child process); the victim is a
root-owned 0600 file nobody cannot read. Each test plants its link, FIFO or pipe
at the moment root's program would use the name, and checks that the victim keeps
its owner, mode and bytes and that root's program stops with a clear message
instead of hanging.
"""
import os
import shutil
import stat
import subprocess

import pytest

from root_paths_support import SECRET, as_attacker, unchanged, victim  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="root's path races need root")]


def expect_line(proc, word):
    line = proc.stdout.readline()
    assert line.strip() == word, line


# swaps the socket for a symlink to the victim the instant it appears
SWAP_SOCKET = r"""
import os, sys
from inotify_simple import INotify, flags
run, victim = sys.argv[1:]
ino = INotify()
ino.add_watch(run, flags.CREATE)
print("ready", flush=True)
while True:
    for event in ino.read():
        if event.name == "qmqp.sock":
            os.symlink(victim, os.path.join(run, "swap"))
            os.rename(os.path.join(run, "swap"), os.path.join(run, "qmqp.sock"))
            print("swapped", flush=True)
            sys.exit(0)
"""


def test_qmqpd_socket_swapped_for_a_symlink_right_after_bind(qmail_home, victim):
    if shutil.which("strace") is None:
        pytest.skip("strace widens bind()'s window (bin/test installs it)")
    run = os.path.join(qmail_home.path, "run")
    attacker = as_attacker(qmail_home, SWAP_SOCKET, run, victim)
    try:
        expect_line(attacker, "ready")
        # bind() returns 1 s late: the swap lands between bind and what follows it (the
        # watcher wakes in milliseconds; the margin is for a loaded machine, where a swap
        # after the chmod would let qmail-qmqpd start and fail the message check below)
        server = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=bind",
             "-e", "inject=bind:delay_exit=1000000", "qmail-qmqpd"],
            env=qmail_home.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
        try:
            expect_line(attacker, "swapped")
            said = server.stderr.readline()
        finally:
            server.kill()
            server.wait(timeout=30)
            server.stderr.close()
    finally:
        attacker.kill()
        attacker.wait(timeout=30)
        attacker.stdout.close()
    assert unchanged(victim), os.lstat(victim)
    # qmailq's own chmod of root's file is refused: qmail-qmqpd says so and does not start
    assert b"unable to listen on" in said and b"Operation not permitted" in said, said


PLANT = r"""
import os, sys
what, path, target = sys.argv[1:]
if what == "symlink":
    if os.path.isdir(path) and not os.path.islink(path):
        os.rename(path, path + ".old")
    elif os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)
print("planted", flush=True)
"""


def plant_symlink(home, rel, target):
    proc = as_attacker(home, PLANT, "symlink", os.path.join(home.path, rel), target)
    expect_line(proc, "planted")
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()


def rerun_init(home, *extra):
    return home.run(["qmailctl", "init", "--home", home.path, "--user", home.user] + list(extra),
                    env=home.env)


@pytest.mark.parametrize("rel", ["queue/lock/tcpto", "queue/lock/sendmutex", "queue/lock/trigger"])
def test_init_rerun_refuses_a_symlink_in_place_of_a_file(qmail_home, victim, rel):
    plant_symlink(qmail_home, rel, victim)
    done = rerun_init(qmail_home)
    assert unchanged(victim), os.lstat(victim)
    assert done.returncode == 1
    assert b"refused" in done.stderr or b"not a named pipe" in done.stderr, done.stderr


def test_init_rerun_refuses_a_symlinked_directory(qmail_home, tmp_path):
    target = tmp_path / "rootdir"       # pytest's base keeps nobody out: only links lead here
    target.mkdir(mode=0o700)
    plant_symlink(qmail_home, "queue/lock", str(target))
    done = rerun_init(qmail_home)
    st = os.lstat(target)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), os.listdir(target)) == (0, 0o700, [])
    assert done.returncode == 1 and b"lock: a symbolic link: refused" in done.stderr, done.stderr


def test_init_rerun_refuses_a_hard_link_to_another_file(qmail_home, victim):
    # what a qmailq could do where fs.protected_hardlinks is off, root stands in for it here
    tcpto = os.path.join(qmail_home.path, "queue", "lock", "tcpto")
    os.unlink(tcpto)
    os.link(victim, tcpto)
    done = rerun_init(qmail_home)
    assert unchanged(victim), os.lstat(victim)
    assert done.returncode == 1 and b"a file with 2 links: refused" in done.stderr, done.stderr


def test_init_rerun_refuses_a_hard_link_to_another_fifo(qmail_home, tmp_path):
    # lock/trigger is a FIFO: root fchowned whatever FIFO qmailq had linked there to qmailq
    fifo = tmp_path / "rootfifo"
    os.mkfifo(fifo, 0o600)
    trigger = os.path.join(qmail_home.path, "queue", "lock", "trigger")
    os.unlink(trigger)
    os.link(fifo, trigger)
    done = rerun_init(qmail_home)
    st = os.lstat(fifo)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600), st
    assert done.returncode == 1 and b"trigger: a named pipe with 2 links: refused" in done.stderr, done.stderr


def test_init_rerun_writes_no_control_file_through_a_symlink(qmail_home, victim):
    plant_symlink(qmail_home, "control/me", victim)
    plant_symlink(qmail_home, "control/roles.tmp", victim)
    done = rerun_init(qmail_home, "--me", "attacker.example")
    assert unchanged(victim), os.lstat(victim)
    assert done.returncode == 1 and b"me: a symbolic link: refused" in done.stderr, done.stderr


# qmails' part: holds lock/sendmutex (qmail-send "running") and answers each command
# with a FIFO or a symlink at NAME.reply
ANSWER = r"""
import fcntl, os, sys
from inotify_simple import INotify, flags
queue, what, victim = sys.argv[1:]
lock = os.open(os.path.join(queue, "lock", "sendmutex"), os.O_RDWR)
fcntl.flock(lock, fcntl.LOCK_EX)
command = os.path.join(queue, "command")
ino = INotify()
ino.add_watch(command, flags.MOVED_TO)
print("ready", flush=True)
while True:
    for event in ino.read():
        if "." not in event.name:
            tmp = os.path.join(command, ".plant")
            if what == "fifo":
                os.mkfifo(tmp)
            else:
                os.symlink(victim, tmp)
            os.rename(tmp, os.path.join(command, event.name + ".reply"))
            print("planted", flush=True)
            sys.stdin.read()
            sys.exit(0)
"""


@pytest.mark.parametrize("what", ["fifo", "symlink"])
def test_queue_command_refuses_a_planted_reply(qmail_home, victim, what):
    attacker = as_attacker(qmail_home, ANSWER, qmail_home.queue, what, victim)
    try:
        expect_line(attacker, "ready")
        try:
            done = qmail_home.run(["qmailctl", "queue", "delete", "--timeout", "20", "12345"], timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("root's qmailctl queue hung on the planted %s" % what)
        expect_line(attacker, "planted")
    finally:
        attacker.kill()
        attacker.wait(timeout=30)
        attacker.stdout.close()
    assert unchanged(victim)
    assert SECRET.strip() not in done.stdout + done.stderr
    assert done.returncode == 111, done.stderr
    why = b"a named pipe" if what == "fifo" else b"a symbolic link"
    assert b".reply: " + why in done.stderr and b"refused" in done.stderr, done.stderr


def test_queue_command_refuses_a_fifo_for_the_send_lock(qmail_home):
    mutex = os.path.join(qmail_home.queue, "lock", "sendmutex")
    proc = as_attacker(qmail_home, "import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1])", mutex)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    try:
        # hold: delete, with qmail-send down, is done by qmailctl itself (queueoffline.py)
        done = qmail_home.run(["qmailctl", "queue", "hold", "12345"], timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl queue hung on a FIFO at lock/sendmutex")
    assert done.returncode == 111
    assert b"sendmutex: a named pipe, not a regular file: refused" in done.stderr, done.stderr


def test_log_writer_refuses_a_log_directory_swapped_for_a_symlink(qmail_home, victim, monkeypatch):
    # qmailctl start runs the log writer as root; in a single-user home the user owns the
    # directory above log/ and can put a symlink to a directory of its own in log/'s place
    from qmailpy.ctl import logwriter
    own = os.path.join(qmail_home.path, "own")
    proc = as_attacker(qmail_home, "import os, sys; os.mkdir(sys.argv[1]); "
                       "os.symlink(sys.argv[2], os.path.join(sys.argv[1], 'qmail-send.log'))", own, victim)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    plant_symlink(qmail_home, "log", own)

    class Retried(Exception):
        pass

    def pause(seconds):
        raise Retried()             # the writer waits to try again, as on a full disk
    monkeypatch.setattr(logwriter.time, "sleep", pause)
    with pytest.raises(Retried):
        logwriter.RotatingLog(os.path.join(qmail_home.path, "log", "qmail-send.log"))
    assert unchanged(victim)


def test_init_rerun_writes_no_launcher_through_a_symlink(qmail_home, victim):
    # bin/ is the user's in a single-user home: root wrote bin/NAME.tmp by name, then chowned it
    plant_symlink(qmail_home, "bin/qmail-send.tmp", victim)
    done = rerun_init(qmail_home)
    assert unchanged(victim), os.lstat(victim)
    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(os.path.join(qmail_home.path, "bin", "qmail-send.tmp"))


SWAP_HOME = "import os, sys; os.rename(sys.argv[1], sys.argv[1] + '.real'); os.symlink(sys.argv[2], sys.argv[1])"


def test_init_rerun_refuses_a_home_swapped_for_a_symlink(qmail_home, tmp_path):
    # ~/qmail: the user owns the directory above a single-user home and can put a symlink
    # in the home's place; root's init opened it and chowned the target (layout's ".") to the user
    base = os.path.dirname(qmail_home.path)
    os.chown(base, qmail_home.uid, qmail_home.gid)
    target = tmp_path / "rootdir"       # pytest's base keeps nobody out: only links lead here
    target.mkdir(mode=0o700)
    proc = as_attacker(qmail_home, SWAP_HOME, qmail_home.path, str(target))
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    done = rerun_init(qmail_home)
    st = os.lstat(target)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), os.listdir(target)) == (0, 0o700, [])
    assert done.returncode == 1, done.stderr
    assert (qmail_home.path + ": a symbolic link: refused").encode() in done.stderr, done.stderr


def test_a_home_reached_through_roots_own_symlink_still_works(qmail_home, tmp_path):
    # an administrator's /var/qmail -> /big/qmail: made by root, in a directory only root writes
    link = tmp_path / "qmail"
    os.symlink(qmail_home.path, link)
    done = qmail_home.run(["qmailctl", "init", "--home", str(link), "--user", qmail_home.user],
                          env=qmail_home.env)
    assert done.returncode == 0, done.stderr


def test_init_rerun_follows_roots_symlink_but_not_a_users_link_beyond_it(qmail_home, tmp_path):
    # root's own link (followed) leads through a directory the user owns, where the user has
    # put a symlink in the home's place: the kernel resolved the whole target
    os.chown(os.path.dirname(qmail_home.path), qmail_home.uid, qmail_home.gid)
    target = tmp_path / "rootdir"
    target.mkdir(mode=0o700)
    proc = as_attacker(qmail_home, SWAP_HOME, qmail_home.path, str(target))
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    link = tmp_path / "qmail"
    os.symlink(qmail_home.path, link)
    done = qmail_home.run(["qmailctl", "init", "--home", str(link), "--user", qmail_home.user],
                          env=qmail_home.env)
    st = os.lstat(target)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), os.listdir(target)) == (0, 0o700, [])
    assert done.returncode == 1 and b"home: a symbolic link: refused" in done.stderr, done.stderr


HOLD_SEND_LOCK = r"""
import fcntl, os, sys
queue, victim = sys.argv[1:]
lock = os.open(os.path.join(queue, "lock", "sendmutex"), os.O_RDWR)
fcntl.flock(lock, fcntl.LOCK_EX)
trigger = os.path.join(queue, "lock", "trigger")
os.unlink(trigger)
os.symlink(victim, trigger)
print("ready", flush=True)
sys.stdin.read()
"""


def test_queue_command_pulls_no_trigger_through_a_symlink(qmail_home, victim):
    # root's qmailctl queue wrote the trigger's NUL byte over the first byte of the linked file
    attacker = as_attacker(qmail_home, HOLD_SEND_LOCK, qmail_home.queue, victim)
    try:
        expect_line(attacker, "ready")
        done = qmail_home.run(["qmailctl", "queue", "hold", "--timeout", "0.5", "12345"], timeout=30)
    finally:
        attacker.kill()
        attacker.wait(timeout=30)
        attacker.stdout.close()
    assert unchanged(victim), open(victim, "rb").read()
    assert done.returncode == 111 and b"did not take the command" in done.stderr, done.stderr


def test_service_log_limits_read_without_waiting_on_a_fifo(qmail_home, tmp_path):
    # qmailctl services and start (root) read control/logsize; a FIFO there hung them for ever
    logsize = os.path.join(qmail_home.path, "control", "logsize")
    proc = as_attacker(qmail_home, "import os, sys; os.mkfifo(sys.argv[1])", logsize)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    try:
        done = qmail_home.run(["qmailctl", "services", "--home", qmail_home.path, "--dir", str(tmp_path / "sv")],
                              env=qmail_home.env, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl services hung on a FIFO at control/logsize")
    assert done.returncode == 0, done.stderr
    from qmailpy.ctl.logwriter import DEFAULT_SIZE
    with open(tmp_path / "sv" / "qmail-send" / "log" / "run") as f:
        assert " %d " % DEFAULT_SIZE in f.read()


def test_open_file_truncates_only_after_refusing_a_hard_link(qmail_home, victim):
    # O_TRUNC in open(2) would cut the linked file before fstat could see its two links
    from qmailpy import nofollow
    os.link(victim, os.path.join(qmail_home.path, "control", "linked"))
    dfd = nofollow.open_path(qmail_home.path, "control")
    try:
        with pytest.raises(nofollow.Refused, match="a file with 2 links"):
            nofollow.open_file("linked", dfd, os.O_WRONLY | os.O_TRUNC)
    finally:
        os.close(dfd)
    assert unchanged(victim)


def test_queue_list_waits_on_no_fifo_in_a_queue_files_place(qmail_home):
    # todo/ is qmailq's, info/ and bounce/ qmails': root's qmailctl queue list opened them by name
    queued = qmail_home.queue_message(b"Subject: x\n\nx\n", b"a@example.com", [b"b@example.com"])
    assert queued.returncode == 0, queued.stderr
    [name] = os.listdir(os.path.join(qmail_home.queue, "todo"))
    proc = as_attacker(qmail_home, "import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1])",
                       os.path.join(qmail_home.queue, "todo", name))
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    try:
        done = qmail_home.run(["qmailctl", "queue", "list"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl queue list hung on a FIFO at todo/N")
    assert ("todo/%s: not a regular file" % name).encode() in done.stdout + done.stderr, done


def test_init_rerun_waits_on_no_fifo_at_control_roles(qmail_home):
    # without --user, root's init reads control/roles, which a single-user home's user owns
    roles = os.path.join(qmail_home.path, "control", "roles")
    proc = as_attacker(qmail_home, "import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1])", roles)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    try:
        done = qmail_home.run(["qmailctl", "init", "--home", qmail_home.path], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl init hung on a FIFO at control/roles")
    assert done.returncode == 1 and b"control/roles: not a regular file" in done.stderr, done.stderr


@pytest.mark.parametrize("what", ["fifo", "symlink"])
def test_root_reads_no_control_file_through_a_fifo_or_the_users_symlink(qmail_home, victim, what):
    # every control file root reads (qmail-smtpd-listen's control/me at its start, ...): a
    # FIFO hung it, a link had root read its own file (as the host name it then announces)
    me = os.path.join(qmail_home.path, "control", "me")
    make = "os.mkfifo(sys.argv[1])" if what == "fifo" else "os.symlink(sys.argv[2], sys.argv[1])"
    proc = as_attacker(qmail_home, "import os, sys; os.unlink(sys.argv[1]); " + make, me, victim)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    try:
        done = qmail_home.run(["qmail-showctl"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmail-showctl hung on a FIFO at control/me")
    assert SECRET.strip() not in done.stdout + done.stderr, done.stdout
    assert done.returncode == 111 and b"Trouble reading control/me." in done.stdout, done.stdout
    from qmailpy.home import ControlError, control_value
    why = "not a regular file" if what == "fifo" else "a symbolic link another account could have made"
    with pytest.raises(ControlError, match="unable to read control/me: " + why):
        control_value(qmail_home.path, "me")


def test_convert_writes_no_marker_through_a_symlink(qmail_home, victim):  # noqa: F811
    # queue/lock/ is qmailq's: root's qmailctl convert wrote lock/convert.tmp by name, then
    # chmodded it 0644 and chowned it to lock/'s owner by name
    plant_symlink(qmail_home, "queue/lock/convert.tmp", victim)
    done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--quiet"])
    assert unchanged(victim), os.lstat(victim)
    assert done.returncode == 0, done.stderr


def test_convert_waits_on_no_fifo_for_the_send_lock(qmail_home):
    mutex = os.path.join(qmail_home.queue, "lock", "sendmutex")
    proc = as_attacker(qmail_home, "import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1])", mutex)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    try:
        done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--quiet"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("root's qmailctl convert hung on a FIFO at lock/sendmutex")
    assert done.returncode == 1 and b"sendmutex: a named pipe" in done.stderr, done.stderr


def test_smtp_listener_reads_no_client_rules_through_the_users_symlink(qmail_home, victim):  # noqa: F811
    # qmail-smtpd-listen (root) read control/smtpclients by name, and its parse error quoted
    # the linked file's first line into the log
    rules = os.path.join(qmail_home.path, "control", "smtpclients")
    proc = as_attacker(qmail_home, "import os, sys; os.symlink(sys.argv[2], sys.argv[1])", rules, victim)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    done = qmail_home.run(["qmail-smtpd-listen", "127.0.0.1:1"], timeout=60)
    assert SECRET.strip() not in done.stderr, done.stderr
    assert done.returncode == 111 and b"a symbolic link another account could have made" in done.stderr, done.stderr


def test_convert_to_dir_writes_no_envelope_through_a_symlink(qmail_home, victim):
    # queue/intd/ is qmailq's (info/, bounce/ and hold/ qmails'): root's qmailctl convert
    # --to dir opened intd/N by name with O_TRUNC, then chowned it to intd/'s owner by name
    done = qmail_home.queue_message(b"Subject: x\n\nbody\n", b"s@x.example", [b"a@test.example"])
    assert done.returncode == 0, done.stderr
    (n,) = os.listdir(os.path.join(qmail_home.queue, "todo"))
    done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--quiet"])
    assert done.returncode == 0, done.stderr
    plant_symlink(qmail_home, "queue/intd/" + n, victim)
    done = qmail_home.run(["qmailctl", "convert", "--to", "dir", "--quiet"])
    assert unchanged(victim), os.lstat(victim)
    assert done.returncode == 1 and b"%s: a symbolic link: refused" % n.encode() in done.stderr, done.stderr
    with open(os.path.join(qmail_home.path, "control", "queuebackend"), "rb") as f:
        assert f.read() == b"log\n"             # the source is kept: the message is still queued


@pytest.mark.parametrize("name", ["commit", "checkpoint.tmp", "counts.tmp"])
def test_convert_to_log_writes_no_log_file_through_a_symlink(qmail_home, victim, name):
    # queue/log/ is qmailq's: root's qmailctl convert --to log opened log/commit for
    # writing by name, and wrote log/checkpoint.tmp and log/counts.tmp with O_TRUNC by name
    done = qmail_home.queue_message(b"Subject: x\n\nbody\n", b"s@x.example", [b"a@test.example"])
    assert done.returncode == 0, done.stderr
    plant_symlink(qmail_home, "queue/log/" + name, victim)
    done = qmail_home.run(["qmailctl", "convert", "--to", "log", "--quiet"])
    assert unchanged(victim), os.lstat(victim)
    if name == "commit":        # refused: the directory queue is kept
        assert done.returncode == 1 and b"Too many levels of symbolic links" in done.stderr, done.stderr
    else:                       # a scratch name: unlinked and made afresh
        assert done.returncode == 0, done.stderr
