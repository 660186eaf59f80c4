"""qmail-start's wiring of the daemons (docs/protocols.md "qmail-start").

    logger (optional)  stdin  <- qmail-start's stdout; qmail-send's log goes there
    qmail-lspawn DD    fd 0 <- send fd 1, fd 1 -> send fd 2    (stays root)
    qmail-rspawn       fd 0 <- send fd 3, fd 1 -> send fd 4    (role qmailr)
    qmail-clean        fd 0 <- send fd 5, fd 1 -> send fd 6    (role qmailq)
                       (each with fd 2 -> the log, where qmail closes it)
    qmail-send         fd 0 = log, 1..6 as above               (this process; qmail-send itself
                                                                becomes qmails after the exec)

Started as root each daemon becomes its role's account (qmailpy.privs;
qmail-send switches itself, after the exec, see qmailpy.cli.qmail_send);
started as anyone else nobody switches. Programs are found through PATH and
inherit the environment. qmail-start ends by exec'ing qmail-send, so its pid
is qmail-send's.
"""
import os

from qmailpy import privs

DEFAULT_DELIVERY = "./Mailbox"


class StartFailure(Exception):
    pass


def _dup_placeholders():
    """fds 2..6 must exist before the pipes are made, so that no pipe lands on them."""
    for fd in range(2, 7):
        os.dup2(0, fd)


def _close_up_to_6(first):
    for fd in range(first, 7):
        try:
            os.close(fd)
        except OSError:
            pass


def _exec(argv):
    try:
        os.execvp(argv[0], argv)
    except OSError:
        pass
    os._exit(111)


def _child(home, role, wiring, argv):
    """fork; in the child switch to role, wire fds, close 3..6 extras, exec argv.

    fd 2 is qmail-start's fd 1, the log: what a spawner or qmail-clean says on its
    stderr (a bug's traceback, docs/delivery.md "Internal errors") is in qmail-send's
    log, where qmail closes it."""
    pid = os.fork()
    if pid:
        return pid
    try:
        if role is not None:
            privs.become(home, role)
        os.dup2(1, 2)
        for target, source in wiring:
            os.dup2(source, target)
        _close_up_to_6(3)
    except BaseException:
        os._exit(111)
    _exec(argv)


def start(home, defaultdelivery=DEFAULT_DELIVERY, logger=()):
    """Wire everything and exec qmail-send; returns only by raising StartFailure."""
    root = os.geteuid() == 0
    home = os.path.abspath(home)
    os.environ["QMAILHOME"] = home      # the daemons find the home after chdir("/")
    try:
        os.chdir("/")
        os.umask(0o077)
        if root:
            gid = privs.group_id(home, "qmail")
            os.setgroups([gid])
            os.setgid(gid)
        _dup_placeholders()
    except (OSError, privs.PrivError) as e:
        raise StartFailure(str(e)) from e
    if logger:
        log_r, log_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                if root:
                    privs.become(home, "qmaill")
                os.dup2(log_r, 0)
                _close_up_to_6(2)
            except BaseException:
                os._exit(111)
            _exec(list(logger))
        os.dup2(log_w, 1)
        os.close(log_r)
        os.close(log_w)
    pipes = [os.pipe() for _ in range(6)]          # pi1..pi6, not inheritable
    (p1r, p1w), (p2r, p2w), (p3r, p3w), (p4r, p4w), (p5r, p5w), (p6r, p6w) = pipes
    _child(home, None, ((0, p1r), (1, p2w)), ["qmail-lspawn", defaultdelivery])
    _child(home, "qmailr", ((0, p3r), (1, p4w)), ["qmail-rspawn"])
    _child(home, "qmailq", ((0, p5r), (1, p6w)), ["qmail-clean"])
    try:
        os.dup2(1, 0)
        for target, source in ((1, p1w), (2, p2r), (3, p3w), (4, p4r), (5, p5w), (6, p6r)):
            os.dup2(source, target)
    except (OSError, privs.PrivError) as e:
        raise StartFailure(str(e)) from e
    for r, w in pipes:
        os.close(r)
        os.close(w)
    _exec(["qmail-send"])
