"""The accounts a qmail-smtpd session runs as when started by root.

qmail runs qmail-smtpd as qmaild, and qmail-queue is setuid qmailq. A Python
qmail-queue cannot be setuid, and the listener runs it in a forked child with
no exec, so a root-started session takes real uid qmaild and effective (and
saved) uid qmailq, group qmail: the queue child then records "from network"
(real uid qmaild) and writes the queue as qmailq, and no root privilege is
left in any process that talks to the network.
"""
import importlib
import os

# Everything a session may import later, loaded while the interpreter's files are
# still readable (and so that forked sessions share them instead of importing).
PRELOAD = ("fcntl", "grp", "pwd", "time", "array", "struct", "socket", "select",
           "qmailpy.queue.client", "qmailpy.queue.qmailqueue", "qmailpy.trigger", "qmailpy.cdb",
           "qmailpy.smtpd.ipme", "qmailpy.smtpd.session")


def preload():
    for name in PRELOAD:
        importlib.import_module(name)


def drop(home):
    """As root: become real qmaild / effective qmailq, group qmail. Otherwise nothing."""
    if os.geteuid() != 0:
        return False
    preload()
    from qmailpy import privs
    roles = privs.load_roles(home)
    qmaild = privs.account(home, "qmaild", roles)
    qmailq = privs.account(home, "qmailq", roles)
    if qmaild.uid == 0 or qmailq.uid == 0:
        raise privs.RootRefused("qmaild and qmailq must not be uid 0")
    gid = privs.group_id(home, "qmail", roles)
    os.setgroups([gid])
    os.setresgid(gid, gid, gid)
    os.setresuid(qmaild.uid, qmailq.uid, qmailq.uid)
    return True
