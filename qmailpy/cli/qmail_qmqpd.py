"""qmail-qmqpd [-c limit] [-s perclient] [-r reserved] [-t timeout] [-n uses] [-i seconds] [--tcp HOST:PORT]:
the queue server (qmail-qmqpd(8)).

Listens on QMAILHOME/run/qmqp.sock (or on the sockets systemd passes), and with
--tcp also on HOST:PORT for the clients control/qmqpclients allows. Started as
root it binds first, then runs as qmailq.
"""
import os
import sys

PROG = "qmail-qmqpd"


def _say(text):
    try:
        sys.stderr.write("%s: %s\n" % (PROG, text))
        sys.stderr.flush()
    except OSError:
        pass


def _parse(argv):
    import argparse
    parser = argparse.ArgumentParser(prog=PROG, description="the QMQP queue server")
    parser.add_argument("-c", dest="limit", type=int, default=None, metavar="LIMIT",
                        help="connections handled at once (default 40)")
    parser.add_argument("-t", dest="timeout", type=float, default=None, metavar="SECONDS",
                        help="time a connection may take (default 1200)")
    parser.add_argument("-s", dest="per_client", type=int, default=None, metavar="PERCLIENT",
                        help="requests one uid or TCP address may have at once (default: half of -c)")
    parser.add_argument("-r", dest="reserved", type=int, default=None, metavar="RESERVED",
                        help="connections kept for qmaild and qmails (default: a quarter of -c)")
    parser.add_argument("-n", dest="max_use", type=int, default=None, metavar="USES",
                        help="requests one queueing worker serves (default 100)")
    parser.add_argument("-i", dest="max_idle", type=float, default=None, metavar="SECONDS",
                        help="idle time after which a worker exits (default 100)")
    parser.add_argument("--tcp", metavar="HOST:PORT", help="also answer QMQP on TCP")
    args = parser.parse_args(argv)
    for name, option in (("limit", "-c"), ("max_use", "-n"), ("per_client", "-s")):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error("%s needs a positive number" % option)
    from qmailpy.queue.server import DEFAULT_LIMIT
    if args.reserved is not None and not 0 <= args.reserved < (args.limit or DEFAULT_LIMIT):
        parser.error("-r needs a number from 0 to one less than -c")
    if args.max_idle is not None and args.max_idle <= 0:
        parser.error("-i needs a positive number of seconds")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("-t needs a positive number of seconds")
    if args.tcp is not None:
        host, sep, port = args.tcp.rpartition(":")
        if not sep or not host or not port.isdigit():
            parser.error("--tcp needs HOST:PORT")
        args.tcp = (host.strip("[]"), int(port))
    return args


def _more_descriptors(wanted=4096):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY
                                                        else min(wanted, hard), hard))
        except (ValueError, OSError):
            pass


def _make_run_dir(home, rel, uid, gid):
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


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    import socket
    from qmailpy import privs
    from qmailpy.home import qmail_home
    from qmailpy.queue import qmailqueue, server
    from qmailpy.queue.client import SOCKET
    from qmailpy.clientrules import Rules
    home = os.path.abspath(qmail_home())
    root = os.geteuid() == 0
    qmailqueue.prepare(home)           # once, for every queueing worker
    try:
        roles = privs.load_roles(home)
        owner = privs.account(home, "qmailq", roles)
        group = privs.group_id(home, "qmail", roles)
    except privs.PrivError as e:
        _say("fatal: %s" % e)
        return 111

    inherited = server.inherited_sockets(os.environ)
    local = next((s for s in inherited if s.family == socket.AF_UNIX), None)
    tcp = next((s for s in inherited if s.family in (socket.AF_INET, socket.AF_INET6)), None)
    path = os.path.join(home, SOCKET)
    bound_path = None
    if local is None:
        try:
            _make_run_dir(home, os.path.dirname(SOCKET), owner.uid if root else None, group)
        except OSError as e:
            _say("fatal: unable to make %s: %s" % (os.path.dirname(path), e.strerror or e))
            return 111
    if tcp is None and args.tcp is not None:
        try:
            tcp = server.bind_tcp(*args.tcp)
        except OSError as e:
            _say("fatal: unable to bind %s:%d: %s" % (args.tcp + (e.strerror,)))
            return 111
    tcp_uid = rules = None
    if tcp is not None:
        try:
            tcp_uid = privs.account(home, "qmaild", roles).uid
        except privs.PrivError as e:
            _say("fatal: QMQP over TCP is queued as qmaild: %s" % e)
            return 111
    try:
        privs.become(home, "qmailq", roles)
        os.chdir(home)
    except (OSError, privs.PrivError) as e:
        _say("fatal: unable to become qmailq: %s" % e)
        return 111
    if tcp is not None:
        # read as qmailq, as every later refresh is: in a single-user home control/ is
        # the user's, and root would follow a symlink or wait on a FIFO planted there
        rules = Rules(os.path.join(home, "control", "qmqpclients"))
        error = rules.refresh()
        if error is not None:
            _say("fatal: %s" % error)
            return 111
    if local is None:
        # bound as qmailq, in qmailq's run/: root never chmods a name there, which qmailq
        # could have swapped for a symlink to any file (docs/security.md "qmail-qmqpd's socket")
        try:
            local = server.bind_local(path)
        except OSError as e:
            _say("fatal: unable to listen on %s: %s" % (path, e.strerror))
            return 111
        bound_path = path

    def warn(text):
        _say("warning: %s; previous rules kept" % text)

    def ready():
        where = [local.getsockname() or path]
        if tcp is not None:
            where.append("%s:%d" % tcp.getsockname()[:2])
        _say("listening on %s" % " and ".join(where))

    _more_descriptors()                # requests waiting in line each hold one
    kwargs = {k: v for k, v in (("limit", args.limit), ("timeout", args.timeout),
                                ("max_use", args.max_use), ("max_idle", args.max_idle),
                                ("per_client", args.per_client), ("reserved", args.reserved))
              if v is not None}
    # qmail-smtpd's sessions (qmaild) and qmail-send's bounces (qmails) all queue here
    kwargs["unlimited"] = set(privs.role_uids(home, ("qmaild", "qmails"), roles).values())
    try:
        return server.Server(home, local, tcp, tcp_uid, rules, warn=warn, **kwargs).serve(ready)
    finally:
        if bound_path is not None:
            try:
                os.unlink(bound_path)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
