"""qmailctl check: compare a home with queue-layout/layout.conf; print every discrepancy.
A mini-qmail home (no queue) is checked for what it has instead (mini_problems).

Exit 0 when the home matches, 1 when anything differs (one line per
discrepancy on stdout), 2 when the layout itself cannot be read.
"""
import os
import sys

HELP = "verify a qmail home against the queue layout"


def add_arguments(parser, name):
    parser.add_argument("--no-owners", action="store_true", help="do not compare owners and groups")


def role_problems(home, roles):
    from qmailpy import hierarchy, privs
    problems = []
    for role in privs.USER_ROLES:
        try:
            uid = privs.uid_of_name(roles[role])
        except privs.PrivError as e:
            problems.append("control/roles: role %s: %s" % (role, e))
            continue
        if uid == 0:
            problems.append("control/roles: role %s is uid 0 (%s)" % (role, roles[role]))
    for group in privs.GROUP_ROLES:
        if group == "qmaillog" and not hierarchy.backend_is_log(home):
            continue                # only the log backend's files use it; real qmail has no such group
        try:
            privs.gid_of_name(roles[group])
        except privs.PrivError as e:
            problems.append("control/roles: group %s: %s" % (group, e))
    return problems


def problems_of(home, check_owners=True):
    from qmailpy import hierarchy, privs
    roles = privs.load_roles(home)
    problems = role_problems(home, roles)
    problems += hierarchy.check_hierarchy(home, owners=hierarchy.Owners(home, roles), check_owners=check_owners)
    if not os.path.isfile(os.path.join(home, "control", "me")):
        problems.append("control/me: missing (every program needs this host's name)")
    if check_owners:
        problems += trusted_file_problems(home, roles)
    if os.geteuid() == 0:
        problems += launcher_problems(home, roles)
    return problems


def launcher_problems(home, roles):
    """Run as root: every account of the home can run the interpreter of HOME/bin's
    launchers with qmailpy (an install under /root gives daemons that cannot start)."""
    from qmailpy import privs
    from qmailpy.ctl import launchers
    written = launchers.written_by(home)
    if written is None:             # no launchers of ours: nothing of ours to run
        return []
    try:
        launchers.check_runnable(roles, *written)
    except launchers.LauncherError as e:
        return [str(e)]
    except privs.PrivError:
        return []                   # a role without its account: role_problems says so
    return []


# Files every program trusts: whoever may write one of them may make qmail deliver
# as another user (users/cdb), relay (control/rcpthosts, smtpclients) or run programs.
TRUSTED_DIRS = ("control", "users")
# Logs hold every envelope address: not for every local user to read.
PRIVATE_DIRS = ("log",)
# Control files that hold a secret: qmail-smtpd's (and qmail-popup's) private key.
SECRET_CONTROL = ("servercert.pem",)


def mini_problems(home, check_owners=True):
    """A mini-qmail home (qmailctl init --mini) has no queue, accounts or daemons:
    control/me, hubs in control/qmqpservers that qmail-qmqpc can use, bin/qmail-queue,
    and control/ owned by root or the home's owner and writable by nobody else."""
    from qmailpy import privs
    from qmailpy.home import BIN, control_list
    from qmailpy.queue.qmqpc import parse_server
    problems = []
    if not os.path.isfile(os.path.join(home, "control", "me")):
        problems.append("control/me: missing (every program needs this host's name)")
    hubs = control_list(home, "qmqpservers", [])
    for hub in hubs:
        if parse_server(hub) is None:
            problems.append("control/qmqpservers: %s is not an IP address (qmail-qmqpc skips it)"
                            % hub.decode("utf-8", "replace"))
    if not any(parse_server(hub) for hub in hubs):
        problems.append("control/qmqpservers: names no hub: qmail-queue can hand no message on")
    if not os.access(os.path.join(home, BIN, "qmail-queue"), os.X_OK):
        problems.append("%s/qmail-queue: missing (qmailctl init --mini writes it)" % BIN)
    if check_owners:
        problems += trusted_file_problems(home, privs.load_roles(home), {0, os.stat(home).st_uid})
    return problems


def trusted_file_problems(home, roles, owners=None):
    """Every file in control/ and users/ owned by root (or the one account of a
    single-user home; or owners, when given) and writable by nobody else; every log
    neither world-readable nor writable by others. A symbolic link is judged by the
    file it names."""
    import stat
    from qmailpy import privs
    if owners is None:
        single = privs.single_user(roles)
        owners = {0} | ({privs.uid_of_name(single)} if single else set())
    problems = []
    for directory in TRUSTED_DIRS + PRIVATE_DIRS:
        base = os.path.join(home, directory)
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            rel = "%s/%s" % (directory, name)
            try:
                st = os.stat(os.path.join(base, name))
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            if directory in PRIVATE_DIRS:
                if name.endswith(".log") and mode & stat.S_IROTH:
                    problems.append("%s: mode %04o lets every local user read every envelope address "
                                    "(fix: chmod o-r %s)" % (rel, mode, rel))
                if name.endswith(".log") and mode & (stat.S_IWGRP | stat.S_IWOTH):
                    problems.append("%s: mode %04o lets others forge or erase log lines "
                                    "(fix: chmod go-w %s)" % (rel, mode, rel))
                continue
            if directory == "control" and name in SECRET_CONTROL and mode & stat.S_IROTH:
                problems.append("%s: mode %04o lets every local user read the server's private key "
                                "(fix: chgrp %s %s; chmod 0640 %s)" % (rel, mode, roles["qmail"], rel, rel))
            if st.st_uid not in owners:
                problems.append("%s: owned by uid %d; only root may own what qmail trusts "
                                "(fix: chown root %s)" % (rel, st.st_uid, rel))
            if mode & (stat.S_IWGRP | stat.S_IWOTH):
                problems.append("%s: mode %04o is writable by group or others "
                                "(fix: chmod go-w %s)" % (rel, mode, rel))
    return problems


def run(args):
    from qmailpy import hierarchy, privs
    from qmailpy.home import qmail_home
    home = os.path.abspath(qmail_home(args.home))
    if not os.path.isdir(home):
        print("%s: not a directory" % home)
        return 1
    from qmailpy.home import mini_queue
    try:
        if mini_queue(home) is not None:
            problems = mini_problems(home, not args.no_owners)
        else:
            problems = problems_of(home, not args.no_owners)
    except (hierarchy.LayoutError, privs.PrivError, OSError) as e:
        print("qmailctl check: %s" % e, file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    return 1 if problems else 0
