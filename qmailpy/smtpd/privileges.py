"""The account a qmail-smtpd session runs as when started by root.

As qmail's `tcpserver -u qmaild -g nofiles`: uid qmaild in all slots, group
nofiles only. The session holds no queue right; it queues through qmail-qmqpd
(qmailpy.queue.client), which records "from network" for qmaild's uid. In a
single-user home qmaild is the queue's owner; the session still queues through
qmail-qmqpd and runs qmail-queue's code itself only when no server answers.
"""
import importlib
import os

# Everything a session may import later, loaded while the interpreter's files are
# still readable (and so that forked sessions share them instead of importing).
PRELOAD = ("fcntl", "grp", "pwd", "time", "array", "struct", "socket", "select",
           "qmailpy.queue.client", "qmailpy.queue.qmailqueue", "qmailpy.queue.qmqp", "qmailpy.trigger", "qmailpy.util.cdb",
           "qmailpy.smtpd.ipme", "qmailpy.smtpd.session")


def preload():
    for name in PRELOAD:
        importlib.import_module(name)


def drop(home):
    """As root: become qmaild, group nofiles, in every slot. Otherwise nothing."""
    if os.geteuid() != 0:
        return False
    preload()
    from qmailpy import privs
    roles = privs.load_roles(home)
    qmaild = privs.account(home, "qmaild", roles)
    if qmaild.uid == 0:
        raise privs.RootRefused("qmaild must not be uid 0")
    gid = privs.group_id(home, "nofiles", roles)
    owner = privs.home_owner(home)
    if owner is not None:
        privs.only_the_owner(owner, "qmaild", qmaild, gid)
    os.setgroups([gid])
    os.setresgid(gid, gid, gid)
    os.setresuid(qmaild.uid, qmaild.uid, qmaild.uid)
    return True


def enter(home):
    """A session's start under tcpserver or systemd: into the home, then, as root, qmaild."""
    os.chdir(home)
    if os.geteuid() == 0:
        drop(home)
