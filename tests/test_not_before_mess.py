"""qmail-queue's not-before time (docs/queue-format.md "Not-before time") is the mess
file's mtime only: its atime stays the time of queueing, which the 36-hour cleanup of
qmail-send (qmail's, and ours: send/clean.py, LEFTOVER_AGE) reads to remove the body of a
message whose queueing never finished. A future atime would keep such debris for as long
as the submitter chose (QMAILNOTBEFORE has 12 digits: any local user, for ever)."""
import os
import time

MSG = b"Subject: later\n\nbody\n"


def _mess_files(queue):
    found = []
    for d in os.listdir(os.path.join(queue, "mess")):
        found.extend(os.path.join(queue, "mess", d, f) for f in os.listdir(os.path.join(queue, "mess", d)))
    return found


def test_not_before_sets_mtime_not_atime(qmail_home):
    not_before = int(time.time()) + 10 * 365 * 86400
    before = time.time()
    done = qmail_home.queue_message(MSG, b"joe@test.example", [b"bench@test.example"],
                                    env=dict(qmail_home.env, QMAILNOTBEFORE="%d" % not_before))
    assert done.returncode == 0, done.stderr
    mess, = _mess_files(qmail_home.queue)
    st = os.stat(mess)
    assert int(st.st_mtime) == not_before
    assert before - 1 <= st.st_atime <= time.time() + 1


def test_deliver_after_a_time_already_past_queues_the_message(qmail_home):
    """-O DeliverAfter= with a time before 1970 is in the past like any other: the message
    is queued for delivery now, its body dated now (it was refused by qmail-queue as a
    temporary failure, exit 75: a negative $QMAILNOTBEFORE is not digits)."""
    before = time.time()
    done = qmail_home.run(["sendmail", "-O", "DeliverAfter=1900-01-01T00:00:00Z", "bench@test.example"],
                          input=MSG)
    assert (done.returncode, done.stderr) == (0, b"")
    mess, = _mess_files(qmail_home.queue)
    assert before - 1 <= os.stat(mess).st_mtime <= time.time() + 1
