"""qmail-queue: queue the message on fd 0 with the envelope on fd 1 (docs/protocols.md "qmail-queue interface").

No arguments (any are ignored, as in qmail); prints nothing; the exit code is
the whole answer. QMAILHOME selects the home.
"""
import os


def main():
    from qmailpy.home import qmail_home
    from qmailpy.queue.qmailqueue import run
    # os._exit: fd 1 is the envelope pipe, so nothing may be flushed to it at exit.
    os._exit(run(qmail_home()))


if __name__ == "__main__":
    main()
