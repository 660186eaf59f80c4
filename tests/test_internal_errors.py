"""A bug is visible where the administrator looks, never a mail-system condition
(docs/delivery.md "Internal errors"): each daemon run with one internal function made to
raise TypeError (tests/bug_harness.py), and what its log, stderr and client show."""
import os
import re
import subprocess
import sys

import pytest

from bug_harness import ECHO, NOMEM, TEXT, buggy_env, write_buggy_programs
from qmailpy import logline
from qmqpd_harness import QmqpServer, ask, request
from smtpd_support import SmtpdProcess
from send_harness import Daemons

MSG = b"Subject: bug\n\nhello\n"


@pytest.fixture
def buggy_daemons(qmail_home, request):
    """The daemons under qmail-start, the program the test is parametrized with buggy."""
    d = Daemons(qmail_home, env=buggy_env(qmail_home, request.param))
    yield d
    d.kill()


def queued_count(home):
    done = home.run(["qmail-qstat"])
    return int(re.search(rb"messages in queue: (\d+)", done.stdout).group(1))


def traceback_of(program, lines, source):
    """The traceback lines program wrote into lines, checked for form: summary, frames
    (one in qmailpy's source file named), the exception last."""
    mine = [line for line in lines if line.startswith(program + ": ")]
    assert program + ": internal error: TypeError: " + TEXT in mine, lines
    assert program + ": | Traceback (most recent call last):" in mine, lines
    assert any(re.match(r'%s: \|   File ".*/qmailpy/%s", line \d+, in ' % (program, source), line)
               for line in mine), mine
    assert program + ": | TypeError: " + TEXT in mine, mine
    return mine


def deferral_of(daemons, program):
    lines = daemons.wait_line(r"^delivery \d+: deferral: ")
    deferrals = [line for line in lines if re.match(r"delivery \d+: deferral: ", line)]
    assert deferrals == [re.sub(r"^(delivery \d+: deferral: ).*", r"\1", deferrals[0])
                         + "internal_error_in_%s:_TypeError:_planted_bug_(#4.3.0)/" % program]
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("buggy_daemons", ["qmail-rspawn"], indirect=True)
def test_a_bug_in_qmail_remote_defers_and_its_traceback_is_in_qmail_sends_log(
        qmail_home, buggy_daemons):
    buggy_daemons.start().wait_started()
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bugged@remote.example"]).returncode == 0
    deferral_of(buggy_daemons, "qmail-remote")
    lines = buggy_daemons.wait_line(r"^qmail-remote: \| TypeError: ")
    traceback_of("qmail-remote", lines, "remote/deliver.py")
    assert not [line for line in lines if line.startswith(("bounce msg", "end msg"))]
    assert queued_count(qmail_home) == 1


@pytest.mark.slow
@pytest.mark.parametrize("buggy_daemons", ["qmail-lspawn"], indirect=True)
def test_a_bug_in_qmail_local_defers_and_its_traceback_is_in_qmail_sends_log(
        qmail_home, users, buggy_daemons):
    users.add("bugged")
    buggy_daemons.start().wait_started()
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bugged@test.example"]).returncode == 0
    deferral_of(buggy_daemons, "qmail-local")
    lines = buggy_daemons.wait_line(r"^qmail-local: \| TypeError: ")
    traceback_of("qmail-local", lines, "local/deliver.py")
    assert not [line for line in lines if line.startswith(("bounce msg", "end msg"))]
    assert queued_count(qmail_home) == 1


# qmailctl start's log writer puts this before each line; logline.parse (the audit's parser)
# then also tries the rest as journald's 'HOST IDENT: ' followed by a qmail line
STAMP = "2026-11-27T06:00:00.000000Z "
FORGED = b"delivery 99: success: did_1+0+0/"


def forged_results(lines):
    """The delivery results in lines that qmail-send did not write (it wrote one deferral)."""
    results = [e for e in (logline.parse(STAMP + line) for line in lines) if e.kind == "delivery"]
    return [e.text for e in results if e.fields["result"] != "deferral"]


@pytest.mark.slow
@pytest.mark.parametrize("buggy_daemons", ["qmail-lspawn"], indirect=True)
@pytest.mark.parametrize("hostile", [
    b"\nx: " + FORGED,                              # a line of its own, read as journald's
    b"\x0b\x1c\xc2\x85" + FORGED,                   # separators of str.splitlines
], ids=["newline", "separators"])
def test_a_traceback_quoting_a_hostile_address_forges_no_log_line(
        qmail_home, users, buggy_daemons, hostile):
    users.add("bugged-", wildcard=True)
    buggy_daemons.start().wait_started()
    recipient = ECHO + hostile + b"@test.example"
    assert qmail_home.queue_message(MSG, b"joe@test.example", [recipient]).returncode == 0
    # qmail-lspawn writes the traceback before its report, so before this line
    lines = buggy_daemons.wait_line(r"^delivery \d+: deferral: internal_error_in_qmail-local")
    assert forged_results(lines) == []
    mine = [line for line in lines if line.startswith("qmail-local: ")]
    assert all(line.isascii() and line.isprintable() and len(line) <= 1100 for line in mine), mine
    known = [line for line in lines if logline.parse(line).kind != "unknown"]
    assert sorted(known + mine) == sorted(lines)   # every line is qmail-send's or prefixed
    assert queued_count(qmail_home) == 1


@pytest.mark.slow
@pytest.mark.parametrize("buggy_daemons", ["qmail-lspawn"], indirect=True)
def test_memory_running_out_in_qmail_local_is_qmails_out_of_memory_not_a_bug(
        qmail_home, users, buggy_daemons):
    users.add("bugged-", wildcard=True)
    buggy_daemons.start().wait_started()
    recipient = NOMEM + b"@test.example"
    assert qmail_home.queue_message(MSG, b"joe@test.example", [recipient]).returncode == 0
    lines = buggy_daemons.wait_line(r"^delivery \d+: deferral: ")
    assert [line for line in lines if line.startswith("delivery ")] == [
        re.sub(r": deferral: .*", ": deferral: Out_of_memory._(#4.3.0)/",
               [line for line in lines if line.startswith("delivery ")][0])]
    assert not [line for line in lines if line.startswith("qmail-local: ")]
    assert queued_count(qmail_home) == 1


@pytest.mark.slow
def test_a_bug_in_qmail_lspawn_itself_is_logged_prefixed(qmail_home, users):
    """qmail-lspawn's stderr is qmail-send's log: a bug outside a delivery (here in the
    recipient's lookup, which qmail-lspawn does itself) ends it with its traceback prefixed,
    not Python's own, whose exception line quoted the address on a line of its own."""
    from bug_harness import write_buggy_programs
    lookup = {"qmail-lspawn": ("qmailpy.local.users", "lookup", "qmailpy.cli.qmail_lspawn")}
    env = dict(qmail_home.env)
    env["PATH"] = (write_buggy_programs(qmail_home, "qmail-lspawn", plants=lookup)
                   + os.pathsep + env["PATH"])
    daemons = Daemons(qmail_home, env=env)
    try:
        daemons.start().wait_started()
        recipient = ECHO + b"\nx: " + FORGED + b"@test.example"
        assert qmail_home.queue_message(MSG, b"joe@test.example", [recipient]).returncode == 0
        lines = daemons.wait_line(r"TypeError: planted bug for bugged-echo")
        lines = daemons.wait_line(r"^(qmail-lspawn: \| )?x: delivery 99")
    finally:
        daemons.kill()
    assert forged_results(lines) == []
    assert "qmail-lspawn: | x: " + FORGED.decode() in lines
    assert queued_count(qmail_home) == 1


def test_a_long_traceback_is_cut_to_whole_prefixed_lines():
    """A delivery worker sends the traceback's end back in its report (internalerror.tail):
    the cut keeps whole lines, so none reaches the log without its prefix (a cut in the
    middle of a quoted address of 16 kB made its end a line of its own)."""
    from qmailpy import internalerror
    try:
        raise TypeError((FORGED + b"x" * 20000).decode())
    except TypeError as e:
        text = internalerror.trace("qmail-local", e)
    cut = internalerror.tail(text, 16384)
    assert len(cut) <= 16384 and cut.endswith(b"\n")
    assert cut.startswith(b"qmail-local: internal error: TypeError: delivery 99")
    lines = cut.decode().split("\n")[:-1]
    assert len(lines) > 2
    assert all(line.startswith("qmail-local: ") and len(line) <= 1100 for line in lines), lines
    assert forged_results(lines) == []


@pytest.mark.parametrize("buggy_daemons", ["qmail-send"], indirect=True)
def test_a_bug_in_qmail_send_is_an_alert_with_its_traceback_and_the_mail_stays_queued(
        qmail_home, users, buggy_daemons):
    users.add("bugged")
    buggy_daemons.start().wait_started()
    assert qmail_home.queue_message(MSG, b"joe@test.example", [b"bugged@test.example"]).returncode == 0
    assert buggy_daemons.proc.wait(timeout=60) == 111
    lines = buggy_daemons.lines()
    assert "alert: internal error in qmail-send: TypeError: %s; exiting" % TEXT in lines
    traceback_of("qmail-send", lines, "send/loop.py")
    assert queued_count(qmail_home) == 1


def test_a_bug_in_a_qmail_smtpd_session_is_a_451_to_the_client_and_a_traceback_on_stderr(
        qmail_home):
    bindir = write_buggy_programs(qmail_home, "qmail-smtpd")
    smtpd = SmtpdProcess(qmail_home, argv=[os.path.join(bindir, "qmail-smtpd")])
    assert smtpd.reply().startswith(b"220 ")
    assert smtpd.command(b"HELO client.example\r\n").startswith(b"250 ")
    assert smtpd.command(b"MAIL FROM:<joe@client.example>\r\n") == b"250 ok\r\n"
    assert (smtpd.command(b"RCPT TO:<bugged@test.example>\r\n")
            == b"451 internal error, closing connection (#4.3.0)\r\n")
    assert smtpd.rest() == b""                  # the session is over
    assert smtpd.close() == 1
    stderr = smtpd.stderr.decode()
    traceback_of("qmail-smtpd", stderr.splitlines(), "smtpd/session.py")
    assert queued_count(qmail_home) == 0


def test_a_bug_after_a_pipelined_message_was_queued_keeps_its_250(qmail_home):
    """The client pipelines the next transaction after the final dot; the bug in it must not
    take away the 250 of the message already queued (the client would send it again)."""
    bindir = write_buggy_programs(qmail_home, "qmail-smtpd")
    smtpd = SmtpdProcess(qmail_home, argv=[os.path.join(bindir, "qmail-smtpd")])
    assert smtpd.reply().startswith(b"220 ")
    assert smtpd.command(b"EHLO client.example\r\n").startswith(b"250")
    assert smtpd.command(b"MAIL FROM:<joe@client.example>\r\n") == b"250 ok\r\n"
    assert smtpd.command(b"RCPT TO:<ann@test.example>\r\n") == b"250 ok\r\n"
    assert smtpd.command(b"DATA\r\n").startswith(b"354 ")
    smtpd.send(b"Subject: x\r\n\r\nhi\r\n.\r\nMAIL FROM:<joe@client.example>\r\n"
               b"RCPT TO:<bugged@test.example>\r\n")
    replies = smtpd.rest()
    assert re.fullmatch(rb"250 ok \d+ qp \d+\r\n250 ok\r\n"
                        rb"451 internal error, closing connection \(#4\.3\.0\)\r\n", replies)
    assert smtpd.close() == 1
    assert queued_count(qmail_home) == 1


def test_a_bug_in_qmail_queue_is_qmails_qq_internal_bug_with_its_traceback_on_stderr(qmail_home):
    done = qmail_home.queue_message(MSG, b"joe@test.example", [b"bugged@test.example"],
                                    env=buggy_env(qmail_home, "qmail-queue"))
    assert done.returncode == 81                # "qq internal bug (#4.3.0)" to its caller
    traceback_of("qmail-queue", done.stderr.decode().splitlines(), "queue/qmailqueue.py")


def test_a_bug_while_qmail_qmqpd_queues_is_a_qq_internal_bug_with_its_traceback_in_its_log(
        qmail_home):
    server = QmqpServer(qmail_home, "-t", "10", env=buggy_env(qmail_home, "qmail-qmqpd"))
    with server:
        answer = ask(server.socket, request(MSG, b"joe@test.example", [b"bugged@test.example"]))
        assert answer == b"Zqq internal bug (#4.3.0)"
        assert server.stop() == 0
    traceback_of("qmail-queue", server.stderr.decode().splitlines(), "queue/qmailqueue.py")


WORKER = r'''
import os
from qmailpy import workers
def body(channel):
    raise TypeError(%(text)r)
worker = workers.fork(body)
print(os.waitstatus_to_exitcode(os.waitpid(worker.pid, 0)[1]))
'''


def test_a_worker_that_ends_with_a_bug_writes_its_traceback_on_the_servers_stderr(tmp_path):
    """qmail-smtpd-listen's and qmail-qmqpd's workers: a bug outside a session or request."""
    script = tmp_path / "qmail-server"
    script.write_text(WORKER % {"text": TEXT})
    done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    assert done.stdout == b"111\n"
    traceback_of("qmail-server worker", done.stderr.decode().splitlines(), "workers.py")


SPAWNER = r'''
import os, sys
from qmailpy import spawn
def run_delivery(sender, recipient):
    raise TypeError(%(text)r)
sys.exit(spawn.serve(run_delivery, lambda wstat, output: b"Z" + output))
'''


def test_a_bug_in_a_forked_spawner_child_is_named_in_the_report_and_traced_on_stderr(tmp_path):
    (tmp_path / "1").write_bytes(MSG)
    command = bytes((0,)) + b"1\0joe@example.org\0rcpt@example.org\0"
    done = subprocess.run([sys.executable, "-c", SPAWNER % {"text": TEXT}], input=command,
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0
    assert done.stdout == (bytes((spawn_slots(),)) + bytes((0,)) + b"Zinternal error in"
                           b" qmail-spawn child: TypeError: planted bug (#4.3.0)\n\0")
    traceback_of("qmail-spawn child", done.stderr.decode().splitlines(), "spawn.py")


def spawn_slots():
    from qmailpy.spawn import SLOTS
    return SLOTS


KEEPER = r'''
import sys
from qmailpy.remote import cache, deliver
class Broken(cache.Connections):
    def keeper(self, key):
        def keep(conn, extensions):
            raise TypeError(%(text)r)
        return keep
bugs = []
records = deliver.records_of([b"x.test", b"a@b.example", b"ann@x.test"], %(home)r, 0,
                             cache=Broken(), alone=[], bugs=bugs)
sys.stdout.buffer.write(deliver.output(records))
sys.stderr.buffer.write(b"".join(bugs))
'''


def test_a_bug_after_the_peer_accepted_the_message_leaves_the_verdict_a_success(qmail_home):
    """A delivery worker keeps the connection once the peer said 250 to the final dot: a bug
    in keeping it is traced, but the message is delivered (K), not deferred to go out twice."""
    from remote_harness import Smtpd, route
    with Smtpd() as peer:
        route(qmail_home, "x.test", peer.port)
        script = KEEPER % {"text": TEXT, "home": qmail_home.path}
        done = subprocess.run([sys.executable, "-c", script], input=MSG, capture_output=True, env=qmail_home.env, timeout=60)
    assert len(peer.transactions) == 1
    assert done.stdout.startswith(b"r\0K127.0.0.1 accepted message.\n"), done
    traceback_of("qmail-remote", done.stderr.decode().splitlines(), "remote/deliver.py")
