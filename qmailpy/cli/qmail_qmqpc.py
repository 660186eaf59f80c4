"""qmail-qmqpc: qmail-queue's interface, the message handed by QMQP to a hub (qmail-qmqpc(8))."""
import sys


def main(argv=None):
    from qmailpy.home import qmail_home
    from qmailpy.queue.qmqpc import run
    return run(qmail_home())


if __name__ == "__main__":
    sys.exit(main())
