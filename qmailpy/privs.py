"""Which account each qmail role uses in a home, and switching to it (docs/architecture.md "Processes and accounts").

qmail compiles its users' ids into the binaries; qmailpy keeps them as data in
the home, in ``control/roles``, so that every program knows which account a
role uses. One line per role, ``role:name``; '#' lines and empty lines are
ignored; a role that is not listed (or a missing file) uses qmail's own name:

    alias:alias      qmaild:qmaild    qmaill:qmaill    qmailp:qmailp
    qmailq:qmailq    qmailr:qmailr    qmails:qmails
    qmail:qmail      nofiles:nofiles  qmaillog:qmaillog   (the group roles)

qmaillog is the group of the log backend's files (queue/log): qmail-queue's code
(as qmailq) and qmail-send (as qmails) both append there, and qmail's own
group qmail will not do because qmailr holds it (to read mess/) while it talks
to remote servers. Both get qmaillog as a supplementary group when they switch.
A roles file that does not name it (a home made before it existed) uses the
qmail group for it, as such homes always did.

A single-user home (``qmailctl init --user NAME``) lists NAME for every user
role and NAME's primary group for both group roles. Started as root, every
program then switches to NAME; started as NAME, nothing switches.

API (everything takes the home directory; names and ids are looked up in the
passwd/group databases at run time, as qmail-lspawn and qmail-getpw do):

    USER_ROLES, GROUP_ROLES          the role names
    default_roles()                  {role: name} with qmail's names
    single_user_roles(name)          {role: name} giving every role to one account
    load_roles(home)                 {role: name} from control/roles (defaults filled in)
    write_roles(home, roles)         write control/roles
    account(home, role)              Account(name, uid, gid, dir) of a user role
    group_id(home, group_role)       gid of 'qmail', 'nofiles' or 'qmaillog'
    role_uids(home, roles=...)       {role: uid} for the roles whose account exists
    single_user(roles)               the one account of a single-user home, else None
    uid_of_name(name), gid_of_name(name)   ids of an account / group (PrivError if none)
    become(home, role)               root: setgroups/setgid/setuid to the role (every
                                     uid slot); else no-op
    switch_to(uid, gid, groups)      the same for an explicit account (qmail-lspawn's
                                     recipients); refuses uid 0 with RootRefused
    only_the_owner(owner, role, acct, gid)   PrivError unless acct and gid are the owner's
    home_owner(home)                 root: the Owner (uid, gid, name, where) of a home whose
                                     control/ or users/ an account other than root owns,
                                     else None; become() and qmail-lspawn switch only to it

A home whose control/ or users/ belongs to an account U other than root (a
single-user home) is U's to edit: started as root, its programs switch to U and
nothing else, whatever control/roles or users/assign say
(docs/security.md "Single-user homes started as root"). A root-owned home trusts both.

Errors: PrivError (role's account or group does not exist, or the switch
failed) and its subclass RootRefused (the account is uid 0).
"""
import os

USER_ROLES = ("alias", "qmaild", "qmaill", "qmailp", "qmailq", "qmailr", "qmails")
GROUP_ROLES = ("qmail", "nofiles", "qmaillog")
ROLES_FILE = "control/roles"

# The group each user role runs with (docs/protocols.md "qmail-start": qmail-start gives qmaill the
# group nofiles and every daemon the group qmail; qmail-getpw runs as qmailp/nofiles).
ROLE_GROUP = {"qmaill": "nofiles", "qmailp": "nofiles"}
# Roles whose own supplementary groups are added (qmail-rspawn: "qmail + qmailr's groups").
KEEPS_OWN_GROUPS = ("qmailr",)
# Roles that write the log backend's files (see the module docstring).
LOG_WRITERS = ("qmailq", "qmails")


class PrivError(Exception):
    """A role's account cannot be found or switched to."""


class RootRefused(PrivError):
    """The account to switch to is uid 0; qmail never runs deliveries as root."""


class Account:
    __slots__ = ("name", "uid", "gid", "dir")

    def __init__(self, name, uid, gid, dir):
        self.name, self.uid, self.gid, self.dir = name, uid, gid, dir

    def __repr__(self):
        return "Account(%r, %d, %d, %r)" % (self.name, self.uid, self.gid, self.dir)


def default_roles():
    roles = {role: role for role in USER_ROLES}
    roles.update({group: group for group in GROUP_ROLES})
    return roles


def single_user_roles(name):
    """Every user role to `name`, both group roles to its primary group."""
    import grp
    import pwd
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise PrivError("no such user: %s" % name) from None
    if pw.pw_uid == 0:
        raise RootRefused("refusing to give the qmail roles to uid 0 (%s)" % name)
    try:
        group = grp.getgrgid(pw.pw_gid).gr_name
    except KeyError:
        group = str(pw.pw_gid)      # a gid without a group entry: keep it numeric
    roles = {role: name for role in USER_ROLES}
    roles.update({g: group for g in GROUP_ROLES})
    return roles


# path -> (signature, roles): a queueing or session worker asks for every message; the file
# is read again whenever its inode, size, mtime or ctime differs.
_roles_read = {}


def load_roles(home):
    """{role: account or group name}; unknown roles in the file are ignored."""
    path = os.path.join(home, ROLES_FILE)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return default_roles()
    except OSError as e:
        raise PrivError("unable to read %s: %s" % (ROLES_FILE, e.strerror)) from e
    signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _roles_read.get(path)
    if known is not None and known[0] == signature:
        return dict(known[1])
    roles = _read_roles(path)
    _roles_read[path] = (signature, roles)
    return dict(roles)


def _read_roles(path):
    roles = default_roles()
    # O_NOFOLLOW|O_NONBLOCK, a regular file only: root reads it at every start, and a
    # single-user home's control/ is its user's (a FIFO there hung root; docs/security.md)
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return roles
    except OSError as e:
        raise PrivError("unable to read %s: %s" % (ROLES_FILE, e.strerror)) from e
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PrivError("unable to read %s: not a regular file" % ROLES_FILE)
        try:
            data = f.read()
        except OSError as e:
            raise PrivError("unable to read %s: %s" % (ROLES_FILE, e.strerror)) from e
    named = set()
    for line in data.decode("utf-8", "surrogateescape").split("\n"):
        line = line.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        role, name = line.split(":", 1)
        role, name = role.strip(), name.strip()
        if role in roles and name:
            roles[role] = name
            named.add(role)
    if "qmaillog" not in named:
        roles["qmaillog"] = roles["qmail"]
    return roles


def write_roles(home, roles):
    lines = ["# role:account (user roles) and role:group (qmail, nofiles, qmaillog); see qmailpy.privs\n"]
    for role in USER_ROLES + GROUP_ROLES:
        lines.append("%s:%s\n" % (role, roles[role]))
    # a new inode, renamed into place: a reader never sees half a file, and a process that
    # read the old one sees the change (load_roles compares the inode, not only the times)
    # through control/'s descriptor, the temporary name made afresh: root writes here
    # also in a single-user home, whose control/ its user owns (docs/security.md)
    from qmailpy import nofollow
    directory, name = os.path.split(ROLES_FILE)
    dfd = nofollow.open_path(home, directory)
    try:
        nofollow.replace(dfd, name, "".join(lines).encode(), 0o644)
    finally:
        os.close(dfd)


def single_user(roles):
    """NAME when every user role of `roles` is NAME (a single-user home), else None."""
    names = {roles[role] for role in USER_ROLES}
    return names.pop() if len(names) == 1 else None


def uid_of_name(name):
    return _user(name).pw_uid


def gid_of_name(name):
    return _group(name)


# Account lookups are cached for the life of the process: qmail compiles its
# uids in at build time, and a long-lived injector (the SMTP listener, a
# spawner) would otherwise repeat the NSS lookups for every message it forks.
_users = {}
_groups = {}


def _user(name):
    pw = _users.get(name)
    if pw is None:
        import pwd
        try:
            pw = pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
        except KeyError:
            raise PrivError("no such user: %s" % name) from None
        _users[name] = pw
    return pw


def _group(name):
    if name.isdigit():
        return int(name)
    gid = _groups.get(name)
    if gid is None:
        import grp
        try:
            gid = grp.getgrnam(name).gr_gid
        except KeyError:
            raise PrivError("no such group: %s" % name) from None
        _groups[name] = gid
    return gid


def account(home, role, roles=None):
    """The Account a user role runs as in this home."""
    if role not in USER_ROLES:
        raise ValueError("not a user role: %r" % role)
    name = (roles or load_roles(home))[role]
    pw = _user(name)
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


def group_id(home, group_role, roles=None):
    if group_role not in GROUP_ROLES:
        raise ValueError("not a group role: %r" % group_role)
    return _group((roles or load_roles(home))[group_role])


def role_uids(home, wanted=USER_ROLES, roles=None):
    """{role: uid} for each wanted role whose account exists (missing accounts left out)."""
    roles = roles or load_roles(home)
    found = {}
    for role in wanted:
        try:
            found[role] = _user(roles[role]).pw_uid
        except PrivError:
            pass
    return found


class Owner:
    """The account other than root that owns a home's control/ or users/ (where: which)."""
    __slots__ = ("uid", "gid", "name", "where")

    def __init__(self, uid, gid, name, where):
        self.uid, self.gid, self.name, self.where = uid, gid, name, where


def home_owner(home):
    """Owner of the home's control/ or users/ when an account other than root owns
    either, else None (a root-owned home, or not running as root). Found through
    descriptors opened with O_NOFOLLOW (qmailpy.nofollow): the name is the owner's to
    swap. PrivError when the two belong to different accounts or the owner has no
    passwd entry."""
    if os.geteuid() != 0:
        return None
    from qmailpy import nofollow
    owners = {}
    for where in ("control", "users"):
        try:
            fd = nofollow.open_path(home, where)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise PrivError("unable to open %s/: %s" % (where, e.strerror or e)) from e
        try:
            uid = os.fstat(fd).st_uid
        finally:
            os.close(fd)
        if uid != 0:
            owners.setdefault(uid, where)
    if not owners:
        return None
    if len(owners) > 1:
        raise PrivError("control/ and users/ belong to different accounts (uids %s); refusing"
                        % " and ".join(str(u) for u in sorted(owners)))
    (uid, where), = owners.items()
    import pwd
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise PrivError("%s/ belongs to uid %d, which has no account; refusing" % (where, uid)) from None
    return Owner(uid, pw.pw_gid, pw.pw_name, where)


def switch_to(uid, gid, groups=()):
    """setgroups, setgid, setuid (in that order; setuid as root sets all three uid
    slots, so nothing can switch back). RootRefused for uid 0.

    No process keeps the queue owner's uid saved: whoever lacks queue rights
    queues through qmail-qmqpd (qmailpy.queue.client)."""
    if uid == 0:
        raise RootRefused("refusing to run as uid 0")
    try:
        os.setgroups(list(groups) or [gid])
        os.setgid(gid)
        os.setuid(uid)
    except OSError as e:
        raise PrivError("unable to switch to uid %d gid %d: %s" % (uid, gid, e.strerror)) from e


def become(home, role, roles=None):
    """Run as the role's account from now on, when that is possible.

    As root: switch (groups = the role's group, plus the account's own groups
    for qmailr; every uid slot) and return True. Otherwise: return False and
    change nothing. RootRefused if the role's account is uid 0.
    """
    roles = roles or load_roles(home)
    acct = account(home, role, roles)
    if acct.uid == 0:
        raise RootRefused("role %s maps to uid 0 (%s); refusing" % (role, acct.name))
    if os.geteuid() != 0:
        return False
    gid = group_id(home, ROLE_GROUP.get(role, "qmail"), roles)
    owner = home_owner(home)
    if owner is not None:
        only_the_owner(owner, role, acct, gid)
    groups = [gid]
    if role in LOG_WRITERS:
        try:
            log_gid = group_id(home, "qmaillog", roles)
        except PrivError:
            log_gid = gid                   # no such group here: the log files have group qmail
        if log_gid not in groups:
            groups.append(log_gid)
    if role in KEEPS_OWN_GROUPS:
        groups += [g for g in os.getgrouplist(acct.name, acct.gid) if g not in groups]
    if owner is not None:               # only groups the owner is in (a roles file's qmaillog)
        own = os.getgrouplist(owner.name, owner.gid)
        groups = [g for g in groups if g == gid or (g != 0 and g in own)]
    switch_to(acct.uid, gid, groups)
    return True


def only_the_owner(owner, role, acct, gid):
    """A home its owner's to edit: every role is the owner, with the owner's group."""
    if acct.uid != owner.uid:
        raise PrivError("role %s is account %s (uid %d), but %s/ belongs to %s (uid %d): a home "
                        "owned by an account other than root runs only as that account; refusing"
                        % (role, acct.name, acct.uid, owner.where, owner.name, owner.uid))
    if gid != owner.gid or gid == 0:
        raise PrivError("role %s runs with gid %d, but %s/ belongs to %s (gid %d): a home owned "
                        "by an account other than root runs only with that account's group; "
                        "refusing" % (role, gid, owner.where, owner.name, owner.gid))
