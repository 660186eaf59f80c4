"""qmail-send's account: started as root (qmail-start does that), it runs as qmails from
then on, in every uid slot; its bounces go to qmail-qmqpd, which records "for bounce" for
qmails."""
import os

from qmailpy import privs


def drop_root(home):
    """Become qmails when root; StartError (qmail-send's 'cannot start') when that fails."""
    if os.geteuid() != 0:
        return
    from qmailpy.send.loop import StartError
    try:
        privs.become(home, "qmails")
    except privs.PrivError as e:
        raise StartError("unable to switch to qmails: %s" % e) from e
