"""qmail-qmqpd's start (qmail-qmqpd(8)): its sockets, accounts and rules, then the server.

The sockets are the ones systemd passes, else bound here: --tcp's HOST:PORT while still
root, QMAILHOME/run/qmqp.sock after becoming qmailq, in qmailq's run/ (root never chmods
a name there, which qmailq could have swapped for a symlink: docs/security.md "qmail-qmqpd's
socket"). control/qmqpclients is read as qmailq too, as every later refresh is.
"""
import os
import socket
import sys

from qmailpy import privs
from qmailpy.clientrules import Rules
from qmailpy.home import qmail_home
from qmailpy.queue import qmailqueue, server
from qmailpy.queue.client import SOCKET

PROG = "qmail-qmqpd"


class Fatal(Exception):
    """The server cannot start; the text follows 'qmail-qmqpd: fatal: '."""


def say(text):
    try:
        sys.stderr.write("%s: %s\n" % (PROG, text))
        sys.stderr.flush()
    except OSError:
        pass


def run(tcp_address, options):
    """Set up and serve until told to stop; the exit status. tcp_address: (host, port) of
    --tcp or None; options: server.Server's keyword arguments given on the command line."""
    home = os.path.abspath(qmail_home())
    qmailqueue.prepare(home)           # once, for every queueing worker
    bound_path = None
    try:
        roles = privs.load_roles(home)
        local, tcp, tcp_uid = _sockets_as_root(home, roles, tcp_address)
        _become_qmailq(home, roles)
        rules = _rules(home) if tcp is not None else None
        if local is None:
            bound_path = os.path.join(home, SOCKET)
            local = _bind_local(bound_path)
    except Fatal as e:
        say("fatal: %s" % e)
        return 111
    except privs.PrivError as e:
        say("fatal: %s" % e)
        return 111

    def warn(text):
        say("warning: %s; previous rules kept" % text)

    def ready():
        where = [local.getsockname() or os.path.join(home, SOCKET)]
        if tcp is not None:
            where.append("%s:%d" % tcp.getsockname()[:2])
        say("listening on %s" % " and ".join(where))

    more_descriptors()                 # requests waiting in line each hold one
    # qmail-smtpd's sessions (qmaild) and qmail-send's bounces (qmails) all queue here
    unlimited = set(privs.role_uids(home, ("qmaild", "qmails"), roles).values())
    try:
        return server.Server(home, local, tcp, tcp_uid, rules, warn=warn, unlimited=unlimited,
                             **options).serve(ready)
    finally:
        if bound_path is not None:
            try:
                os.unlink(bound_path)
            except OSError:
                pass


def _sockets_as_root(home, roles, tcp_address):
    """(local, tcp, tcp_uid): the sockets systemd passed (local None: bound later, as
    qmailq, in run/, made here first if missing), --tcp's bound now, and the uid TCP
    requests are queued as (qmaild)."""
    owner = privs.account(home, "qmailq", roles)
    group = privs.group_id(home, "qmail", roles)
    inherited = server.inherited_sockets(os.environ)
    local = next((s for s in inherited if s.family == socket.AF_UNIX), None)
    tcp = next((s for s in inherited if s.family in (socket.AF_INET, socket.AF_INET6)), None)
    if local is None:
        run_dir = os.path.dirname(SOCKET)
        try:
            make_run_dir(home, run_dir, owner.uid if os.geteuid() == 0 else None, group)
        except OSError as e:
            raise Fatal("unable to make %s: %s" % (os.path.join(home, run_dir), e.strerror or e))
    if tcp is None and tcp_address is not None:
        try:
            tcp = server.bind_tcp(*tcp_address)
        except OSError as e:
            raise Fatal("unable to bind %s:%d: %s" % (tcp_address + (e.strerror,)))
    tcp_uid = None
    if tcp is not None:
        try:
            tcp_uid = privs.account(home, "qmaild", roles).uid
        except privs.PrivError as e:
            raise Fatal("QMQP over TCP is queued as qmaild: %s" % e)
    return local, tcp, tcp_uid


def _become_qmailq(home, roles):
    try:
        privs.become(home, "qmailq", roles)
        os.chdir(home)
    except (OSError, privs.PrivError) as e:
        raise Fatal("unable to become qmailq: %s" % e)


def _rules(home):
    # read as qmailq, as every later refresh is: in a single-user home control/ is
    # the user's, and root would follow a symlink or wait on a FIFO planted there
    rules = Rules(os.path.join(home, "control", "qmqpclients"))
    error = rules.refresh()
    if error is not None:
        raise Fatal(error)
    return rules


def _bind_local(path):
    # bound as qmailq, in qmailq's run/: root never chmods a name there, which qmailq
    # could have swapped for a symlink to any file (docs/security.md "qmail-qmqpd's socket")
    try:
        return server.bind_local(path)
    except OSError as e:
        raise Fatal("unable to listen on %s: %s" % (path, e.strerror))


def more_descriptors(wanted=4096):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY
                                                        else min(wanted, hard), hard))
        except (ValueError, OSError):
            pass


def make_run_dir(home, rel, uid, gid):
    """run/ for a home made before it existed: made by root in the home (root's own
    directory), then given to qmailq through its descriptor."""
    from qmailpy import nofollow
    hfd = nofollow.open_home(home)
    try:
        try:
            os.mkdir(rel, 0o755, dir_fd=hfd)
        except FileExistsError:
            return
        if uid is not None:
            fd = nofollow.open_dir(rel, hfd)
            try:
                os.fchown(fd, uid, gid)
            finally:
                os.close(fd)
    finally:
        os.close(hfd)
