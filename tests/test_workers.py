"""Long-lived workers instead of a fork per connection, request or delivery.

qmail-smtpd-listen's session workers, qmail-qmqpd's queueing workers and
qmail-lspawn's delivery workers each serve one job at a time and many in their
life: these tests watch the real processes (their pids from /proc, psutil) while
real clients talk to them, and check that nothing of one job reaches the next,
that the limits on uses hold, and that a worker killed in the middle of a job
loses that job only.
"""
import os
import shutil
import signal
import smtplib
import socket
import subprocess
import sys

import psutil
import pytest
from inotify_simple import INotify, flags

from conftest import AS_ROOT
from qmailpy import spawn
from lspawn_harness import maildir_files
from qmailpy.queue.server import R_TOO_MANY
from qmqpd_harness import QmqpServer, ask, connect, netstring, request
from queue_view import queued
from smtpd_support import TIMEOUT, ListenerProcess, reporting_queue

pytestmark = pytest.mark.slow

MESSAGE = b"Subject: w\r\n\r\nhi\r\n"
GOOD = request(b"Subject: hi\n\nhello\n", b"a@example.org", [b"b@example.net"])


def workers_of(pid):
    return {p.pid for p in psutil.Process(pid).children()}


def session_worker(listener):
    """The pid of the listener's one worker while a session is open (-c 1)."""
    found = workers_of(listener.proc.pid)
    assert len(found) == 1, found
    return found.pop()


def greeted(port, source="127.0.0.1"):
    conn = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT,
                                    source_address=(source, 0))
    assert conn.recv(100).startswith(b"220 ")
    return conn


def closed(conn):
    """The peer closed the connection (a reset counts: it died with our bytes unread)."""
    try:
        data = conn.recv(100)
    except ConnectionResetError:
        data = b""
    conn.close()
    return data == b""


def quit_(conn):
    conn.sendall(b"QUIT\r\n")
    assert conn.recv(100).startswith(b"221 ")
    assert conn.recv(100) == b""            # the worker let go of the connection
    conn.close()


def test_one_session_worker_serves_connection_after_connection(qmail_home):
    with ListenerProcess(qmail_home, "-c", "1") as listener:
        pids = []
        for _ in range(3):
            conn = greeted(listener.port)
            pids.append(session_worker(listener))
            quit_(conn)
        assert len(set(pids)) == 1, pids
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            assert client.sendmail("me@test.example", ["you@test.example"], MESSAGE) == {}
        assert workers_of(listener.proc.pid) == {pids[0]}
        assert listener.stop() == 0
    assert len(queued(qmail_home)) == 1


def test_a_session_worker_retires_after_its_uses(qmail_home):
    with ListenerProcess(qmail_home, "-c", "1", "-n", "2") as listener:
        pids = []
        for _ in range(3):
            conn = greeted(listener.port)
            pids.append(session_worker(listener))
            quit_(conn)
        assert pids[0] == pids[1] != pids[2], pids


@pytest.mark.parametrize("blocked", [(), (signal.SIGCHLD,)], ids=["", "SIGCHLD blocked at start"])
def test_retired_session_workers_are_reaped(qmail_home, blocked):
    # -n 1: every session retires its worker. The listener reaps a worker when its SIGCHLD
    # wakes the loop, also when it was started with SIGCHLD blocked; a worker left a zombie
    # would never be gone.
    with ListenerProcess(qmail_home, "-c", "1", "-n", "1", blocked=blocked) as listener:
        seen = set()
        for _ in range(4):
            conn = greeted(listener.port)
            seen |= workers_of(listener.proc.pid)
            quit_(conn)
        assert len(seen) == 4
        retired = []
        for pid in seen:
            try:
                retired.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass                        # reaped already
        assert psutil.wait_procs(retired, timeout=TIMEOUT)[1] == []
        assert listener.stop() == 0

def test_an_idle_session_worker_retires(qmail_home):
    with ListenerProcess(qmail_home, "-c", "1", "-i", "1") as listener:
        conn = greeted(listener.port)
        worker = psutil.Process(session_worker(listener))
        quit_(conn)
        worker.wait(timeout=TIMEOUT)        # gone after a second without work
        assert workers_of(listener.proc.pid) == set()
        quit_(greeted(listener.port))       # and a new one serves the next client


def test_rule_variables_do_not_outlive_their_session(qmail_home):
    """127.0.0.1 may relay (RELAYCLIENT from control/smtpclients); 127.0.0.2, served next
    by the same worker, may not."""
    qmail_home.control("smtpclients", '127.0.0.1:allow,RELAYCLIENT=""\n:allow\n')
    env = dict(qmail_home.env)
    env.pop("RELAYCLIENT", None)
    with ListenerProcess(qmail_home, "-c", "1", env=env) as listener:
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            first = session_worker(listener)
            assert client.sendmail("me@test.example", ["far@elsewhere.example"], MESSAGE) == {}
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT,
                          source_address=("127.0.0.2", 0)) as client:
            assert session_worker(listener) == first
            with pytest.raises(smtplib.SMTPRecipientsRefused):
                client.sendmail("me@test.example", ["far@elsewhere.example"], MESSAGE)
    assert [m.recipients for m in queued(qmail_home)] == [[b"far@elsewhere.example"]]


def test_one_worker_gives_each_session_exactly_its_own_environment(qmail_home):
    # -c 1: one session worker serves both sessions. Its environment is set per session by
    # changing only what differs (qmailpy.util.environ), so a rule's variable of the first
    # client must be gone for the second, and each sees its own port, in the environment a
    # $QMAILQUEUE program inherits.
    env = reporting_queue(qmail_home, "${FIRSTONLY-unset}", "${BOTH-unset}", "$TCPREMOTEIP",
                          "$TCPREMOTEPORT")
    qmail_home.control("smtpclients", '127.0.0.1:allow,FIRSTONLY="one",BOTH="a"\n127.0.0.2:allow,BOTH="b"\n')
    answers = []
    with ListenerProcess(qmail_home, "-c", "1", env=env) as listener:
        for source in ("127.0.0.1", "127.0.0.2", "127.0.0.1"):
            with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT,
                              source_address=(source, 0)) as client:
                client.mail("a@b.example")
                client.rcpt("x@test.example")
                code, text = client.data(b"hi\r\n")
                answers.append((code, text, client.sock.getsockname()[1]))
        assert listener.stop() == 0
    (c1, t1, p1), (c2, t2, p2), (c3, t3, p3) = answers
    assert (c1, c2, c3) == (554, 554, 554)
    assert t1 == b"one|a|127.0.0.1|%d" % p1
    assert t2 == b"unset|b|127.0.0.2|%d" % p2
    assert t3 == b"one|a|127.0.0.1|%d" % p3

def test_a_session_worker_killed_mid_session_loses_that_session_only(qmail_home):
    with ListenerProcess(qmail_home, "-c", "1") as listener:
        conn = greeted(listener.port)
        conn.sendall(b"HELO x\r\nMAIL FROM:<a@test.example>\r\nRCPT TO:<b@test.example>\r\n"
                     b"DATA\r\n")
        replies = b""
        while b"354 " not in replies:
            data = conn.recv(1000)
            assert data, replies
            replies += data
        conn.sendall(b"Subject: half\r\n")
        os.kill(session_worker(listener), signal.SIGKILL)
        assert closed(conn)
        with smtplib.SMTP("127.0.0.1", listener.port, timeout=TIMEOUT) as client:
            assert client.sendmail("me@test.example", ["you@test.example"], MESSAGE) == {}
    assert [m.recipients for m in queued(qmail_home)] == [[b"you@test.example"]]


def test_a_client_that_reconnects_after_quit_is_not_counted_twice(qmail_home):
    """-s 1: a client that connects again as soon as its session closed is served; the
    listener hears that the session ended before the client sees the close (it answered
    most such reconnections 421 too many connections from your address)."""
    with ListenerProcess(qmail_home, "-c", "4", "-s", "1") as listener:
        for _ in range(40):
            quit_(greeted(listener.port))


# --- qmail-qmqpd -------------------------------------------------------------------

def qp(answer):
    assert answer.startswith(b"Kok "), answer
    return int(answer.rsplit(b" ", 1)[1])


@pytest.mark.both_backends
def test_queueing_workers_serve_request_after_request_without_a_fork(qmail_home):
    with QmqpServer(qmail_home, "-c", "1", "-n", "3") as server:
        pids = [qp(ask(server.socket, GOOD)) for _ in range(4)]
        assert pids[0] == pids[1] == pids[2] != pids[3], pids
        assert workers_of(server.proc.pid) == {pids[3]}
    msgs = queued(qmail_home)
    assert len(msgs) == 4
    # the Received line names the process that queued it, as qmail-queue's does
    assert sorted(int(m.mess.split(b" ")[2]) for m in msgs) == sorted(pids)


@pytest.mark.both_backends
def test_a_queueing_worker_killed_mid_request_queues_nothing_and_is_replaced(qmail_home):
    with QmqpServer(qmail_home, "-c", "1", "-t", "30") as server:
        first = qp(ask(server.socket, GOOD))
        ino = INotify()
        ino.add_watch(os.path.join(qmail_home.queue, "pid"), flags.CREATE)
        half = connect(server.socket)
        half.sendall(GOOD[:20])              # the request in hand, unfinished:
        assert ino.read(timeout=TIMEOUT * 1000)     # the worker has begun its message
        os.kill(first, signal.SIGKILL)
        assert closed(half)
        assert qp(ask(server.socket, GOOD)) != first
    assert len(queued(qmail_home)) == 2


def files_open(pid):
    """A process's descriptors other than sockets (a worker may not have closed the connection
    it just answered yet)."""
    found = {}
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            path = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except FileNotFoundError:       # closed since the listing (the answered connection)
            continue
        if not path.startswith("socket:"):
            found[fd] = path
    return found


@pytest.mark.both_backends
def test_a_queueing_worker_keeps_no_descriptor_of_a_request_it_queued(qmail_home):
    """Each request's mess (and intd) file is closed when it is queued: a worker that kept
    them would run out of descriptors after a few hundred requests and hold deleted files."""
    with QmqpServer(qmail_home, "-c", "1", "-n", "1000") as server:
        worker = qp(ask(server.socket, GOOD))
        after_one = files_open(worker)
        for _ in range(10):
            assert qp(ask(server.socket, GOOD)) == worker
        assert files_open(worker) == after_one
        assert not [path for path in after_one.values() if "/queue/" in path]


# --- qmail-lspawn --------------------------------------------------------------------

PROGRAM = "|echo worker=$PPID uid=$(id -u)\n./Maildir/\n"


class Lspawn:
    """qmail-lspawn with its command pipe kept open: one delivery at a time, as qmail-send's
    commands arrive."""

    def __init__(self, users, wrapper=()):
        program = shutil.which("qmail-lspawn", path=users.qh.env["PATH"])
        self.users = users
        self.proc = subprocess.Popen([*wrapper, program, "./Maildir/"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=users.qh.env)
        assert os.read(self.proc.stdout.fileno(), 1) == bytes((spawn.SLOTS,))
        self.replies = spawn.ReplyReader()

    def deliver(self, recipient, slot=0):
        mess = self.users.mess(b"Subject: x\n\nhello\n")
        self.proc.stdin.write(self.users.command(slot, mess, b"joe@example.org", recipient))
        self.proc.stdin.flush()
        while True:
            data = os.read(self.proc.stdout.fileno(), 4096)
            assert data, "qmail-lspawn went away"
            got = self.replies.feed(data)
            if got:
                [(got_slot, letter, text)] = got
                assert got_slot == slot
                return letter, text

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=TIMEOUT) == 0
        self.proc.stdout.close()


def program_report(reply):
    """(worker pid, uid) from a delivery's `worker=PID uid=UID` line."""
    letter, text = reply
    assert letter == b"K", reply
    words = dict(w.split(b"=") for w in text.split(b"\n")[0].split())
    return int(words[b"worker"]), int(words[b"uid"])


def test_deliveries_to_one_account_share_a_worker(users):
    home = users.add("amy")
    users.dotqmail(home, "", PROGRAM)
    lspawn = Lspawn(users)
    reports = [program_report(lspawn.deliver(b"amy@test.example")) for _ in range(3)]
    workers = workers_of(lspawn.proc.pid)
    lspawn.close()
    assert len(set(reports)) == 1, reports
    assert workers == {reports[0][0]}
    files = maildir_files(os.path.join(home, "Maildir"))
    assert len(files) == 3                  # three names: one process, no clash, no wait


def test_each_delivery_of_a_worker_gets_qmail_lspawns_environment_and_its_own_variables(users):
    # A program's environment: qmail-lspawn's own (QPY_FROM_START here), then qmail-local's
    # variables of this delivery; a worker passes its environment along from one delivery
    # to the next without reading it back, so a second delivery must see its own EXT.
    home = users.add("eve-", wildcard=True, dash="-")
    users.dotqmail(home, "-default", '|echo "$QPY_FROM_START $EXT $DEFAULT $RECIPIENT"\n')
    users.qh.env["QPY_FROM_START"] = "inherited"
    try:
        lspawn = Lspawn(users)
        first = lspawn.deliver(b"eve-one@test.example")
        second = lspawn.deliver(b"eve-two@test.example")
        workers = workers_of(lspawn.proc.pid)
        lspawn.close()
    finally:
        del users.qh.env["QPY_FROM_START"]
    assert len(workers) == 1
    assert first == (b"K", b"inherited one one eve-one@test.example\ndid 0+0+1\n")
    assert second == (b"K", b"inherited two two eve-two@test.example\ndid 0+0+1\n")

@pytest.mark.skipif(not AS_ROOT, reason="switching to two accounts needs root")
def test_each_account_has_its_own_worker_with_its_own_uid(users, tmp_path):
    # qmail's real multi-user setup: control/ and users/ are root's. The fixture's
    # single-user home (its account owns control/) may deliver only as that account.
    for where in ("control", "users"):
        os.chown(os.path.join(users.qh.path, where), 0, 0)
    accounts = {"bob": 61001, "cat": 61002}
    for name, uid in accounts.items():
        home = users.add(name, uid=uid, gid=uid)
        users.dotqmail(home, "", PROGRAM)
        for path in (home, os.path.join(home, ".qmail")) + tuple(
                os.path.join(home, "Maildir", sub) for sub in ("", "tmp", "new", "cur")):
            os.chown(path, uid, uid)
    lspawn = Lspawn(users)
    got = {name: program_report(lspawn.deliver(name.encode() + b"@test.example"))
           for name in ("bob", "cat", "bob")}
    lspawn.close()
    assert got["bob"][1] == 61001 and got["cat"][1] == 61002
    assert got["bob"][0] != got["cat"][0]


def test_a_delivery_worker_killed_mid_delivery_loses_that_delivery_only(users):
    home = users.add("dan")
    users.dotqmail(home, "", "|kill -9 $PPID\n")
    lspawn = Lspawn(users)
    assert lspawn.deliver(b"dan@test.example") == (b"Z", b"qmail-local crashed.\n")
    users.dotqmail(home, "", "./Maildir/\n")
    assert lspawn.deliver(b"dan@test.example") == (b"K", b"did 1+0+0\n")
    lspawn.close()
    assert len(maildir_files(os.path.join(home, "Maildir"))) == 1


def test_a_program_gets_no_descriptor_of_its_worker(users):
    """A |program sees the message and the report pipe only: fd 3, the worker's channel to
    qmail-lspawn (root), is closed on exec. A program that wrote a report of its own there
    ended qmail-lspawn, and with it qmail-send."""
    home = users.add("eve")
    users.dotqmail(home, "", "|ls -l /proc/self/fd; printf garbage >&3\n")
    other = users.add("fay")
    users.dotqmail(other, "", "./Maildir/\n")
    lspawn = Lspawn(users)
    letter, text = lspawn.deliver(b"eve@test.example")
    assert b"socket:" not in text, text
    assert letter == b"Z", text             # the printf failed: no fd 3
    assert lspawn.deliver(b"fay@test.example") == (b"K", b"did 1+0+0\n")
    lspawn.close()


def test_a_report_qmail_lspawn_cannot_read_counts_as_a_crash(users):
    """The worker runs as the recipient; what it sends qmail-lspawn is not trusted: a report
    that is not an exit status, or one sent while it has no job, ends the worker."""
    import selectors
    from qmailpy import workers
    from qmailpy.local.workerpool import DeliveryWorkers

    def liar(*reports):
        def body(channel):
            workers.next_job(channel, 2)
            for report in reports:
                workers.send(channel, report)
            channel.recv(1)                 # until qmail-lspawn lets go
            return 0
        return body

    pool = DeliveryWorkers(users.qh.path, b"./Maildir/")
    selector = selectors.DefaultSelector()
    pool.register(selector)
    key = (users.qh.uid, users.qh.gid)

    def hand(slot, body):
        out_r, out_w = os.pipe()
        mess = os.open(os.devnull, os.O_RDONLY)
        pool.hand(key, body, slot, b"job", [mess, out_w])
        os.close(mess)
        os.close(out_w)
        os.close(out_r)

    def next_report():
        [(ready, _)] = selector.select(TIMEOUT)
        return ready.data[1], pool.readable(ready.data[1])

    hand(7, liar(b"garbage"))
    worker, done = next_report()
    assert done == [(7, signal.SIGKILL, None)]
    assert not pool.live and not pool.idle  # dropped, not kept for the next delivery
    os.waitpid(worker.pid, 0)

    hand(8, liar(b"0", b"0"))
    worker, done = next_report()
    assert done == [(8, 0, None)] and worker in pool.idle
    assert next_report() == (worker, [])    # a second report, with no job in hand
    assert not pool.live and not pool.idle
    os.waitpid(worker.pid, 0)
    selector.close()


def test_a_damaged_users_cdb_fails_the_delivery_not_qmail_lspawn(users):
    """qmail-lspawn reads users/cdb itself now: a record pointing past the end of the file
    is qmail's 'Trouble reading users/cdb', not the end of qmail-lspawn."""
    import struct
    from qmailpy.util.cdb import cdb_hash
    users.add("gus")
    h = cdb_hash(b"")
    header = bytearray(2048)
    struct.pack_into("<II", header, (h & 255) * 8, 2048, 1)
    with open(os.path.join(users.qh.path, "users", "cdb"), "wb") as f:
        f.write(bytes(header) + struct.pack("<II", h, 10 ** 6))
    lspawn = Lspawn(users)
    assert lspawn.deliver(b"gus@test.example") == (b"Z", b"Trouble reading users/cdb in qmail-lspawn.\n")
    lspawn.close()


def test_a_worker_that_cannot_be_forked_gets_qmail_spawns_reply(users):
    """qmail's spawn.c: 'Z' and 'qmail-spawn unable to fork. (#4.3.0)'; the letter once."""
    import resource
    home = users.add("hal")
    users.dotqmail(home, "", "./Maildir/\n")
    uid, gid = users.qh.uid, users.qh.gid

    def no_more_processes():
        if AS_ROOT:                         # root is not held by RLIMIT_NPROC
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))   # after the switch: exec still works
    program = shutil.which("qmail-lspawn", path=users.qh.env["PATH"])
    proc = subprocess.Popen([program, "./Maildir/"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=users.qh.env, preexec_fn=no_more_processes)
    mess = users.mess(b"Subject: x\n\nhello\n")
    proc.stdin.write(users.command(0, mess, b"joe@example.org", b"hal@test.example"))
    proc.stdin.close()
    out = proc.stdout.read()
    assert proc.wait(timeout=TIMEOUT) == 0
    proc.stdout.close()
    assert out[:1] == bytes((spawn.SLOTS,))
    assert spawn.ReplyReader().feed(out[1:]) == [(0, b"Z", b"qmail-spawn unable to fork. (#4.3.0)\n")]


def test_a_program_that_lowers_its_workers_limits_does_not_reach_the_next_delivery(users):
    """A worker runs as the account, so the account's program may prlimit it; the worker
    then ends after that delivery and the next one gets a fresh worker. The worker says
    so in its report: under strace every look at a limit takes a tenth of a second, so a
    worker that looked only after reporting would still be looking when qmail-lspawn
    handed it the next delivery (which then failed as "qmail-local crashed", as it did
    once in a loaded CI run)."""
    home = users.add("ida")
    users.dotqmail(home, "", "./Maildir/\n|prlimit --pid $PPID --nofile=5:5\n")
    slow_limits = ("strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=prlimit64",
                   "-e", "inject=prlimit64:delay_enter=100000") if shutil.which("strace") else ()
    lspawn = Lspawn(users, slow_limits)
    assert lspawn.deliver(b"ida@test.example") == (b"K", b"did 1+0+1\n")
    users.dotqmail(home, "", PROGRAM)
    first = program_report(lspawn.deliver(b"ida@test.example"))
    second = program_report(lspawn.deliver(b"ida@test.example"))
    lspawn.close()
    assert first[0] == second[0]            # a new worker, which then serves on
    assert len(maildir_files(os.path.join(home, "Maildir"))) == 3


HOLD = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"100:")                  # a request begun and never finished
print("held", flush=True)
sys.stdin.readline()
"""
CROWD = r"""
import socket, sys
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.setblocking(False)
    socks.append(s)
last = socks[-1]
last.setblocking(True)
last.settimeout(30)
print(last.recv(1000).decode(), flush=True)
"""


def as_uid(uid, script, *args, **popen):
    return subprocess.Popen([sys.executable, "-c", script] + [str(a) for a in args], user=uid,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, **popen)


@pytest.mark.skipif(not AS_ROOT, reason="needs a second local uid")
def test_one_local_uid_cannot_take_every_queueing_worker(qmail_home):
    """-c 2 -s 1: while a user holds one request open, its next request waits in line and
    another uid is still served; when the first ends, the waiting one is queued."""
    other = 61017
    with QmqpServer(qmail_home, "-c", "2", "-s", "1", "-r", "0", "-t", "60") as server:
        holder = as_uid(other, HOLD, server.socket)
        try:
            assert holder.stdout.readline() == b"held\n"
            waiting = as_uid(other, "from qmailpy.queue.client import ServerSubmission\n"
                             "import sys\nq = ServerSubmission(sys.argv[1])\nq.write(b'Subject: w\\n\\nx\\n')\n"
                             "print(q.finish(b'a@example.org', [b'w@example.net']).code, flush=True)\n",
                             qmail_home.path, env=dict(qmail_home.env))
            assert qp(ask(server.socket, GOOD))     # root's request still has a worker
            assert waiting.poll() is None           # the same user's second one waits ...
            holder.stdin.write(b"go\n")
            holder.stdin.flush()
            assert waiting.stdout.readline() == b"0\n"     # ... and is queued after the first
            assert waiting.wait(timeout=TIMEOUT) == 0
        finally:
            holder.stdin.close()
            holder.wait(timeout=TIMEOUT)
    assert sorted(m.recipients[0] for m in queued(qmail_home)) == [b"b@example.net", b"w@example.net"]


@pytest.mark.skipif(not AS_ROOT, reason="needs a second local uid")
def test_a_crowd_from_one_uid_beyond_its_line_is_told_too_many(qmail_home):
    from qmailpy.queue.server import WAIT_PER_CLIENT
    other = 61018
    with QmqpServer(qmail_home, "-c", "2", "-s", "1", "-r", "0", "-t", "60") as server:
        holder = as_uid(other, HOLD, server.socket)
        try:
            assert holder.stdout.readline() == b"held\n"
            crowd = as_uid(other, CROWD, server.socket, WAIT_PER_CLIENT + 1)
            out, _ = crowd.communicate(timeout=TIMEOUT)
            assert out == netstring(R_TOO_MANY) + b"\n"
            assert qp(ask(server.socket, GOOD))
        finally:
            holder.stdin.close()
            holder.wait(timeout=TIMEOUT)
        assert server.alive()
    assert len(queued(qmail_home)) == 1
