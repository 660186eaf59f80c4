"""qmailctl init: create a qmail home from queue-layout/layout.conf (docs/queue-format.md "Queue directory layout"; docs/control-files.md "Control files").

Creates whatever is missing and sets modes; owners are set only when run as
root. The role -> account table goes to control/roles (qmailpy.privs):
`--user NAME` gives every role to NAME (a single-user home); run as root
without --user, qmail's own accounts are used and must exist; run as any other
user without --user, the home becomes a single-user home of that user, since
nobody else could own its files anyway. Control files are written only when
missing (control/me also when --me is given), with qmail's installer
conventions: me = FQDN, defaultdomain = FQDN minus its first label,
plusdomain = its last two labels, locals and rcpthosts = the FQDN; and, not in
qmail, databytes = qmailpy.sizelimits.SHIPPED_DATABYTES (qmail's missing file means no limit).

Every run (re)writes HOME/bin/: one launcher per program, which starts the
Python running qmailctl without site (qmailpy.ctl.launchers); the daemons
exec their programs from there.
"""
import os
import re
import sys

HELP = "create a qmail home (queue hierarchy, control files, role accounts)"


def add_arguments(parser, name):
    parser.add_argument("--me", metavar="HOST", help="this host's fully qualified name (default: the system's)")
    parser.add_argument("--user", metavar="NAME", help="single-user home: every role runs as NAME")
    parser.add_argument("--mini", nargs="+", metavar="HUB",
                        help="a mini-qmail home: no queue, qmail-queue is qmail-qmqpc to these hubs")


def default_domain(fqdn):
    """qmail's config-fast: drop the first label when at least three remain."""
    return re.sub(r"^([^.]*)\.([^.]*)\.", r"\2.", fqdn, count=1)


def plus_domain(fqdn):
    """qmail's config-fast: the last two labels when there are at least three."""
    return re.sub(r"^.*\.([^.]*)\.([^.]*)$", r"\1.\2", fqdn, count=1)


def choose_roles(home, user):
    import pwd
    from qmailpy import privs
    if user:
        return privs.single_user_roles(user)
    if os.path.exists(os.path.join(home, privs.ROLES_FILE)):
        return privs.load_roles(home)
    if os.geteuid() != 0:
        return privs.single_user_roles(pwd.getpwuid(os.geteuid()).pw_name)
    roles = privs.default_roles()
    for role in privs.USER_ROLES:
        privs.uid_of_name(roles[role])
    try:
        privs.gid_of_name(roles["qmaillog"])
    except privs.PrivError:
        # a system set up for qmail alone: its files keep group qmail, which qmailr holds too
        print("qmailctl init: warning: no group qmaillog; the log backend's files get group qmail, "
              "which qmail-rspawn holds too (create it: groupadd --system qmaillog)", file=sys.stderr)
        roles["qmaillog"] = roles["qmail"]
    for group in privs.GROUP_ROLES:
        privs.gid_of_name(roles[group])
    return roles


def control_files(fqdn):
    from qmailpy.sizelimits import NETWORK_CONTROL, SHIPPED_DATABYTES
    return {
        "me": fqdn + "\n",
        "defaultdomain": default_domain(fqdn) + "\n",
        "plusdomain": plus_domain(fqdn) + "\n",
        "locals": fqdn + "\n",
        "rcpthosts": fqdn + "\n",
        NETWORK_CONTROL: "%d\n" % SHIPPED_DATABYTES,
    }


def run(args):
    from qmailpy import hierarchy, privs
    from qmailpy.ctl import launchers
    from qmailpy.home import qmail_home
    home = os.path.abspath(qmail_home(args.home))
    if args.mini:
        from qmailpy.ctl import mini
        return mini.run(args, home, args.me or _fqdn())
    try:
        roles = choose_roles(home, args.user)
    except privs.PrivError as e:
        print("qmailctl init: %s" % e, file=sys.stderr)
        print("qmailctl init: create qmail's accounts, or use --user NAME for a single-user home",
              file=sys.stderr)
        return 1
    root = os.geteuid() == 0
    try:
        if root:
            launchers.check_runnable(roles)      # before anything is written
        os.makedirs(home, exist_ok=True)
        owners = hierarchy.Owners(home, roles)
        created = hierarchy.create_hierarchy(home, owners=owners, set_owners=root)
        privs.write_roles(home, roles)
        written = _write_control(home, control_files(args.me or _fqdn()), args.me, owners, root)
        programs = launchers.write(home, *((owners.uid("root"), owners.gid("qmail")) if root else ()))
    except (OSError, hierarchy.LayoutError, privs.PrivError, launchers.LauncherError) as e:
        print("qmailctl init: %s" % e, file=sys.stderr)
        return 1
    account = privs.single_user(roles)
    print("qmailctl init: %s: %d paths created, control files written: %s; %d programs in %s; %s" % (
        home, len(created), " ".join(written) or "none", len(programs), os.path.join(home, "bin"),
        "single-user home of %s" % account if account else "qmail's own accounts"))
    return 0


def _write_control(home, wanted, me_given, owners, root):
    """Write the missing control files (control/me also when --me is given) and set
    control/roles' and their owner and mode, through descriptors: in a single-user
    home control/ is that user's, and root must not follow a symlink planted there
    (docs/security.md "Root and other accounts' directories")."""
    from qmailpy import nofollow
    from qmailpy.fileio import write_all
    written = []
    dfd = nofollow.open_path(home, "control")
    try:
        for name in ["roles"] + list(wanted):
            if name == "roles":
                fd = nofollow.open_file(name, dfd)
            else:
                replace = name == "me" and me_given
                flags = os.O_WRONLY | os.O_CREAT | (0 if replace else os.O_EXCL)
                try:
                    fd = nofollow.open_file(name, dfd, flags, mode=0o644)
                except FileExistsError:
                    continue
                os.ftruncate(fd, 0)          # only now: open_file has refused a linked file
                write_all(fd, wanted[name].encode())
                written.append(name)
            try:
                if root:
                    os.fchown(fd, owners.uid("root"), owners.gid("qmail"))
                os.fchmod(fd, 0o644)
            finally:
                os.close(fd)
    finally:
        os.close(dfd)
    return written


def _fqdn():
    import socket
    return socket.getfqdn()
