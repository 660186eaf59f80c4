"""qmail-queue: queue the message on fd 0 with the envelope on fd 1 (docs/protocols.md "qmail-queue interface").

No arguments (any are ignored, as in qmail); the exit code is the whole answer.
QMAILHOME selects the home. Run by root or by the queue's owner it writes the
queue itself; run by anyone else it reads the message and the envelope and hands
them to qmail-qmqpd (qmail-qmqpd(8)), which queues them for this uid, and exits
with the code qmail-queue gave there (74 when no server answers, with the reason
on fd 2).
"""
import os


def _relay(home):
    from qmailpy.queue import qmqp
    from qmailpy.queue.client import NO_SERVER, ServerSubmission
    submission = ServerSubmission(home)
    try:
        while True:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            submission.write(chunk)
        sender, recipients = qmqp.relay_envelope(lambda: os.read(1, 65536))
    except ValueError as e:
        submission.abort()
        return e.args[0]
    except OSError:
        submission.abort()
        return 54
    except MemoryError:
        submission.abort()
        return 51
    result = submission.finish(sender, recipients)
    if result.code == NO_SERVER:
        os.write(2, b"qmail-queue: " + result.text + b"\n")
    return result.code


def main():
    from qmailpy.home import has_queue_rights, qmail_home
    home = qmail_home()
    if has_queue_rights(home):
        from qmailpy.queue.qmailqueue import run
        # os._exit: fd 1 is the envelope pipe, so nothing may be flushed to it at exit.
        os._exit(run(home))
    os._exit(_relay(home))


if __name__ == "__main__":
    main()
