"""qmail-lspawn: local deliveries for qmail-send (qmail-lspawn(8); docs/delivery.md "qmail-lspawn (root)").

Commands arrive on fd 0 and replies leave on fd 1 in the spawn protocol
(qmailpy.spawn). qmail-lspawn finds the recipient (qmailpy.local.users) and
hands the delivery to a delivery worker running as that account
(qmailpy.local.workerpool): a process forked from this one without an exec,
which runs qmail-local's code (qmailpy.local.deliver) with the message on fd 0
and the report pipe on fds 1 and 2, and then waits for the next delivery to
the same account. Its exit status and output become the K/Z/D reply.
Everything a worker needs is imported here, before the first fork, so a
delivery costs neither an interpreter start nor (once a worker for that
account is idle) a fork.

Privileges: run as root (as qmail-start does), a worker switches to its
recipient's uid and gid (groups = just that gid) in every slot, for good,
and uid 0 is refused (exit 113). In a home whose control/ or users/ an
account other than root owns (a single-user home), that account's users/assign
names nobody else: any other uid or gid, and gid 0, gets a temporary failure
(privs.home_owner; docs/security.md "Single-user homes started as root").
Run as an ordinary user, no switch is possible: a recipient whose uid is this
process's uid is delivered as usual (a single-user home, where users/assign and
the alias role name that one account), any other recipient gets a temporary
failure that says so.

The lookup (users/cdb, then the passwd database: qmail's qmail-getpw, which
qmail runs as qmailp) happens in qmail-lspawn itself, before a worker is
chosen: it only reads users/cdb and the passwd database and stats home
directories.
"""
import os

from qmailpy import spawn

# Exit statuses of a delivery child with a fixed reply (qmail's qlx.h texts).
FIXED = {
    112: b"ZInternal qmail-lspawn bug.\n",
    113: b"ZNot allowed to perform deliveries as root.\n",
    115: b"ZNFS failure in qmail-local.\n",
    116: b"ZUnable to find alias user!\n",
    117: b"ZTrouble reading users/cdb in qmail-lspawn.\n",
    118: b"ZTemporary failure in qmail-lspawn.\n",
    119: b"ZOut of memory in qmail-lspawn.\n",
    120: b"ZUnable to run qmail-local.\n",
    121: b"ZUnable to run qmail-getpw.\n",
    126: b"DUnable to run qmail-local.\n",
}
TEMPORARY_CODES = (111, 71, 74, 75)


def report(wstat, output):
    """A finished child's reply: letter and text (docs/delivery.md "qmail-lspawn (root)")."""
    if os.WIFSIGNALED(wstat):
        return b"Zqmail-local crashed.\n"
    code = os.WEXITSTATUS(wstat)
    if code in FIXED:
        return FIXED[code]
    letter = b"K" if code == 0 else b"Z" if code in TEMPORARY_CODES else b"D"
    output = spawn.truncate_report(output)
    nul = output.find(b"\0")
    return letter + (output if nul < 0 else output[:nul])


PRELOAD = ("fcntl", "pwd", "resource", "qmailpy.util.cdb", "qmailpy.envelope", "qmailpy.privs",
           "qmailpy.local.dotqmail", "qmailpy.local.errors", "qmailpy.local.forward",
           "qmailpy.local.maildir", "qmailpy.local.mbox", "qmailpy.local.program",
           "qmailpy.queue.client", "qmailpy.queue.qmailqueue", "qmailpy.queue.qmqp")


def _preload():
    """Import what delivery children use, once, in the parent."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)


def run(home, aliasempty, infd=0, outfd=1):
    """Serve qmail-send until fd 0 closes; returns the exit status."""
    from qmailpy import privs
    home = os.path.abspath(home)
    try:
        owner = privs.account(home, "qmailq").uid
    except privs.PrivError as e:
        os.write(2, b"qmail-lspawn: fatal: %s\n" % str(e).encode())
        return 111
    _preload()
    # Children share the parent's objects copy-on-write; a collection in a
    # child would touch (and so copy) all of them.
    import gc
    gc.freeze()
    try:
        os.chdir(os.path.join(home, "queue", "mess"))
    except OSError as e:
        os.write(2, b"qmail-lspawn: fatal: unable to chdir to queue/mess: %s\n"
                 % e.strerror.encode())
        return 111

    from qmailpy.local.workerpool import DeliveryWorkers
    try:
        pool = DeliveryWorkers(home, aliasempty)
    except privs.PrivError as e:
        os.write(2, b"qmail-lspawn: fatal: %s\n" % str(e).encode())
        return 111
    return spawn.serve(None, report, expected_owner=owner, infd=infd, outfd=outfd, pool=pool)
