"""qmailctl queue delete | hold | release | requeue | bounce against a running qmail-send,
on both backends (docs/qmail-send.md "Commands"): what the operator sees (exit codes,
stdout and stderr), qmail-send's log lines, Maildirs and the SMTP peer."""
import json
import os
import re
import signal
import sys
import time

import pytest

from delivery_support import wait_maildir
from lspawn_harness import LocalUsers
from queue_commands_support import PEER, SlowDelivery, ctl, deferred_message, peer  # noqa: F401  (fixture)
from send_harness import Daemons, wait_mess_gone

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def view(home, *args):
    """qmailctl queue list | size | shape (they take no --timeout)."""
    done = home.run(["qmailctl", "queue", args[0], "--home", home.path] + list(args[1:]))
    assert done.returncode == 0, done.stderr
    return done


def listed(home, *args):
    """The numbers `queue list ARGS` shows, or with --json its records."""
    out = view(home, "list", *args).stdout
    if "--json" in args:
        return [json.loads(line) for line in out.splitlines()]
    return [int(n) for n in re.findall(rb"  #(\d+)  ", out)]


def starts_of(daemons, n, since=0):
    return [l for l in daemons.lines()[since:] if re.match(r"starting delivery \d+: msg %d " % n, l)]


def test_hold_survives_restart_and_requeue_releases(qmail_home, peer):
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        held = deferred_message(qmail_home, daemons, peer, "bob")
        other = deferred_message(qmail_home, daemons, peer, "amy")
        done = ctl(qmail_home, "hold", str(held))
        assert (done.returncode, done.stdout, done.stderr) == (0, b"%d: held\n" % held, b"")
        assert "hold msg %d" % held in daemons.lines()
        again = ctl(qmail_home, "hold", str(held))
        assert again.returncode == 1 and b"%d: already held" % held in again.stderr
        # what list, size and the filters show of it: HELD, and still preprocessed with a remote recipient
        for state, expected in (("held", [held]), ("preprocessed", [held, other]), ("remote", [held, other])):
            assert sorted(listed(qmail_home, "--state", state)) == sorted(expected), state
        record, = listed(qmail_home, "--json", str(held))
        assert (record["state"], record["held"]) == ("HELD", True)
        assert re.search(rb"#%d  \d+  <joe@test.example>  held\n" % held, view(qmail_home, "list").stdout)
        sizes = json.loads(view(qmail_home, "size", "--json").stdout)
        assert (sizes["held"], sizes["preprocessed"], sizes["remote"], sizes["total"]) == (1, 2, 2, 2)
        assert daemons.stop() == 0
        daemons.start()
        daemons.wait_started()
        since = daemons.line_count()
        peer.rcpt_replies.clear()
        daemons.signal(signal.SIGALRM)                 # everything waiting is due now
        daemons.wait_line(r"^end msg %d$" % other)
        assert starts_of(daemons, held, since) == []   # held: not tried, not delivered
        assert [t.rcpt_tos for t in peer.transactions] == [["amy@" + PEER]]
        done = ctl(qmail_home, "requeue", str(held))
        assert (done.returncode, done.stdout) == (0, b"%d: requeued\n" % held)
        daemons.wait_line(r"^end msg %d$" % held)
        lines = daemons.lines()
        assert lines.index("release msg %d" % held) < lines.index("requeue msg %d" % held)
        assert [t.rcpt_tos for t in peer.transactions][-1] == ["bob@" + PEER]
    finally:
        daemons.kill()


def test_release_and_unknown_numbers(qmail_home, peer):
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        done = ctl(qmail_home, "release", str(n))
        assert done.returncode == 1 and done.stderr == b"qmailctl queue release: %d: not held\n" % n
        nothing = ctl(qmail_home, "hold", "--recipient-domain", "nowhere.example")
        assert (nothing.returncode, nothing.stderr) == (1, b"qmailctl queue hold: no message matches\n")
        usage = ctl(qmail_home, "hold")
        assert usage.returncode == 2 and b"name the messages" in usage.stderr
        usage = ctl(qmail_home, "delete", "18446744073709551616")      # no inode is that big
        assert usage.returncode == 2 and b"'18446744073709551616' is not a message number" in usage.stderr
        done = ctl(qmail_home, "hold", "--recipient-domain", PEER)     # the filters select it
        assert (done.returncode, done.stdout) == (0, b"%d: held\n" % n)
        done = ctl(qmail_home, "release", str(n), "999999999")
        assert done.returncode == 1
        assert done.stdout == b"%d: released\n" % n
        assert done.stderr == b"qmailctl queue release: 999999999: not in queue\n"
        assert "release msg %d" % n in daemons.lines()
        peer.rcpt_replies.clear()
        daemons.signal(signal.SIGALRM)                 # released: tried with the rest
        daemons.wait_line(r"^end msg %d$" % n)
        gone = ctl(qmail_home, "delete", str(n))
        assert gone.returncode == 1 and gone.stderr == b"qmailctl queue delete: %d: not in queue\n" % n
    finally:
        daemons.kill()


def test_release_past_lifetime_bounces_on_next_attempt(qmail_home, peer):
    users = LocalUsers(qmail_home)
    joe = users.add("joe")
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        assert ctl(qmail_home, "hold", str(n)).returncode == 0
        assert daemons.stop() == 0
        qmail_home.control("queuelifetime", "1\n")
        birth = os.stat(os.path.join(qmail_home.queue, "mess", str(n % 23), str(n))).st_mtime
        while time.time() < birth + 2:                 # the message outlives its lifetime
            time.sleep(0.1)
        daemons.start()
        daemons.wait_started()
        done = ctl(qmail_home, "release", str(n))
        assert done.returncode == 0
        daemons.signal(signal.SIGALRM)
        daemons.wait_line(r"^end msg %d$" % n)
        assert any(re.match(r"delivery \d+: failure: .*I'm_not_going_to_try_again", l)
                   for l in daemons.lines())
        bounce = wait_maildir(os.path.join(joe, "Maildir"), 1)
        assert b"<bob@peer.example>:" in bounce[0]
    finally:
        daemons.kill()


def test_bounce_with_reason(qmail_home, peer):
    users = LocalUsers(qmail_home)
    joe = users.add("joe")
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        done = ctl(qmail_home, "bounce", "--reason", "Mailbox moved to the archive.", str(n))
        assert (done.returncode, done.stdout) == (0, b"%d: bounced 1 recipient\n" % n)
        daemons.wait_line(r"^end msg %d$" % n)
        lines = daemons.lines()
        now_line = "bounce now msg %d: Mailbox_moved_to_the_archive." % n
        assert lines.index(now_line) < next(i for i, l in enumerate(lines)
                                            if l.startswith("bounce msg %d qp " % n))
        bounce = wait_maildir(os.path.join(joe, "Maildir"), 1)[0]
        assert b"<bob@peer.example>:\nMailbox moved to the archive.\n" in bounce
        assert b"Subject: failure notice" in bounce
        usage = ctl(qmail_home, "bounce", str(n))
        assert usage.returncode == 2 and b"--reason" in usage.stderr
    finally:
        daemons.kill()


def test_delete_waits_for_delivery_in_flight(qmail_home):
    """A slow |program delivery is in flight: delete answers once it has finished, and
    the message's other recipient is never delivered."""
    slow = SlowDelivery(qmail_home)
    marker = slow.marker
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = slow.queue(daemons)
        proc = slow.delete_claimed(n)
        assert proc.poll() is None                     # it waits for the delivery in flight
        assert not os.path.exists(marker)
        slow.go()
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out, err) == (0, b"%d: deleted\n" % n, b"")
        assert os.path.exists(marker)                  # finished before delete returned
        lines = daemons.lines()
        assert re.match(r"delivery \d+: success: ", lines[lines.index("delete msg %d" % n) - 1]) or \
            any(re.match(r"delivery \d+: success: ", l) for l in lines[:lines.index("delete msg %d" % n)])
        assert not any(l.endswith(" other@test.example") for l in lines)
        assert "end msg %d" % n not in lines
        wait_mess_gone(qmail_home, n)
        assert os.listdir(slow.other_new) == []
        assert daemons.proc.poll() is None
    finally:
        daemons.kill()


def test_garbage_in_the_command_channel(qmail_home, peer):
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        n = deferred_message(qmail_home, daemons, peer, "bob")
        cdir = os.path.join(qmail_home.queue, "command")
        junk = {"plain": os.urandom(300), "empty": b"", "badaction": b"action explode\nmsg 1\n",
                "with.dot": b"action delete\nmsg %d\n" % n, "nonl": b"action delete\nmsg 1",
                "reasonless": b"action bounce\nmsg %d\n" % n}
        junk.update(("flood%03d" % i, b"msg x\n" * i) for i in range(150))
        for name, data in junk.items():     # each whole when it appears: qmail-send may
            staged = os.path.join(qmail_home.queue, "junk-" + name)     # look at any time
            with open(staged, "wb") as f:
                f.write(data)
            os.rename(staged, os.path.join(cdir, name))
        done = ctl(qmail_home, "hold", str(n))          # pulls the trigger: all are read
        assert (done.returncode, done.stdout) == (0, b"%d: held\n" % n)
        daemons.wait_for(lambda ls: sum(1 for l in ls if l.startswith("warning: command/")) >= len(junk),
                         what="a warning per garbage file")
        warnings = [l for l in daemons.lines() if l.startswith("warning: command/")]
        assert "warning: command/with.dot: not a command name; ignored" in warnings
        assert "warning: command/badaction.work: unknown line 'action explode'; ignored" in warnings
        assert os.listdir(cdir) == []
        assert daemons.proc.poll() is None
        assert ctl(qmail_home, "delete", str(n)).returncode == 0
        wait_mess_gone(qmail_home, n)
    finally:
        daemons.kill()


def test_nothing_is_done_without_qmail_send(qmail_home):
    """But for delete, which works without it (tests/test_poison_message.py)."""
    done = ctl(qmail_home, "hold", "12345")
    assert (done.returncode, done.stdout) == (111, b"")
    assert done.stderr == b"qmailctl queue hold: qmail-send is not running; nothing done\n"
    assert os.listdir(os.path.join(qmail_home.queue, "command")) == []
    done = ctl(qmail_home, "delete", "12345")
    assert (done.returncode, done.stdout, done.stderr) == (1, b"", b"qmailctl queue delete: 12345: not in queue\n")
    assert os.listdir(os.path.join(qmail_home.queue, "command")) == []


QUEUE_MANY = r'''
import sys
from qmailpy.queue.client import QueueClient
home, count = sys.argv[1], int(sys.argv[2])
for i in range(count):
    qq = QueueClient(home)
    qq.write(b"Subject: %d\n\nhi\n" % i)
    assert qq.finish(b"joe@test.example", [b"u%d@later.example" % i]).ok
'''


def test_a_command_for_more_messages_than_a_batch(qmail_home):
    """450 messages (more than two of qmail-send's batches of 200), preprocessed and held back
    by control/delaydomains: hold selects them by a filter and holds each once, with a line
    each; delete then removes them all, and the queue is empty."""
    count = 450
    qmail_home.control("delaydomains", "later.example:86400\n")
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        done = qmail_home.run([sys.executable, "-c", QUEUE_MANY, qmail_home.path, str(count)])
        assert done.returncode == 0, done.stderr
        daemons.wait_line(r"^info msg ", count)
        held = ctl(qmail_home, "hold", "--recipient-domain", "later.example")
        assert (held.returncode, held.stderr) == (0, b"")
        numbers = [int(line.split(b":")[0]) for line in held.stdout.splitlines()]
        assert len(numbers) == count == len(set(numbers))
        assert sorted(held.stdout.splitlines()) == sorted(b"%d: held" % n for n in numbers)
        assert sorted(int(l.split()[2]) for l in daemons.lines() if l.startswith("hold msg ")) == sorted(numbers)
        sizes = qmail_home.run(["qmailctl", "queue", "size", "--json", "--home", qmail_home.path])
        assert json.loads(sizes.stdout)["held"] == count
        gone = ctl(qmail_home, "delete", *map(str, reversed(numbers)))
        assert (gone.returncode, len(gone.stdout.splitlines())) == (0, count)
        assert sum(1 for l in daemons.lines() if l.startswith("delete msg ")) == count
        sizes = qmail_home.run(["qmailctl", "queue", "size", "--json", "--home", qmail_home.path])
        assert json.loads(sizes.stdout)["total"] == 0
        assert not [l for l in daemons.lines() if l.startswith("starting delivery ")]
    finally:
        daemons.kill()
