"""qmailctl check: compare a home with queue-layout/layout.conf; print every discrepancy.

Exit 0 when the home matches, 1 when anything differs (one line per
discrepancy on stdout), 2 when the layout itself cannot be read.
"""
import os
import sys

HELP = "verify a qmail home against the queue layout"


def add_arguments(parser, name):
    parser.add_argument("--no-owners", action="store_true", help="do not compare owners and groups")


def role_problems(home, roles):
    from qmailpy import privs
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
        try:
            privs.gid_of_name(roles[group])
        except privs.PrivError as e:
            problems.append("control/roles: group %s: %s" % (group, e))
    return problems


def problems_of(home, check_owners=True):
    from qmailpy import layout, privs
    roles = privs.load_roles(home)
    problems = role_problems(home, roles)
    problems += layout.check_hierarchy(home, owners=layout.Owners(home, roles), check_owners=check_owners)
    if not os.path.isfile(os.path.join(home, "control", "me")):
        problems.append("control/me: missing (every program needs this host's name)")
    return problems


def run(args):
    from qmailpy import layout, privs
    from qmailpy.home import qmail_home
    home = os.path.abspath(qmail_home(args.home))
    if not os.path.isdir(home):
        print("%s: not a directory" % home)
        return 1
    try:
        problems = problems_of(home, not args.no_owners)
    except (layout.LayoutError, privs.PrivError, OSError) as e:
        print("qmailctl check: %s" % e, file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    return 1 if problems else 0
