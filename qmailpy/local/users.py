"""Who receives mail for a local part (docs/delivery.md "qmail-lspawn (root)" steps 2-3; qmail-users(5)).

lookup(home, local) answers what qmail-lspawn learns from users/cdb or
qmail-getpw: the account (name, uid, gid), its home directory, and the dash
and extension qmail-local gets. The order is qmail's:

1. users/cdb (built by qmail-newu from users/assign): the exact entry
   ``!local\\0`` (lowercased), then the wildcard entries ``!prefix`` from the
   longest prefix down, trying only prefixes whose last character is one of
   the wildcard characters stored under the empty key, and finally ``!``; a
   wildcard hit gets the rest of the local part (original case) appended.
   qmailpy extension: when users/cdb does not exist but users/assign does,
   users/assign is parsed directly with the same rules and the same result,
   so a home works without a compile step; users/cdb, once built, wins.
2. the passwd database, with qmail-getpw's rules: the whole local part, then
   each prefix ending just before a ``-``, longest first, lowercased, shorter
   than 32 bytes; accepted if the uid is not 0 and the home directory exists
   and belongs to that uid.
3. the alias user (the home's ``alias`` role, see qmailpy.privs) with dash
   ``-`` and the whole local part as extension. As in a standard install its
   home directory is QMAILHOME/alias, not the passwd entry's.

Failures raise LookupFailure with qmail-lspawn's exit code (117 users/cdb
unreadable or users/assign malformed, 116 no alias user, 115 NFS trouble,
112 malformed entry).

compile_assign(home) is qmail-newu: users/assign -> users/cdb.
"""
import os

from qmailpy.util import cdb

ASSIGN = "users/assign"
CDB = "users/cdb"
GETPW_USERLEN = 32

QLX_USAGE = 112
QLX_NFS = 115
QLX_NOALIAS = 116
QLX_CDB = 117


class LookupFailure(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class AssignError(ValueError):
    """users/assign breaks qmail-newu's format rules."""


class Recipient:
    """One local delivery target: qmail-local's user, homedir, dash and ext."""
    __slots__ = ("user", "uid", "gid", "home", "dash", "ext")

    def __init__(self, user, uid, gid, home, dash, ext):
        self.user, self.uid, self.gid = user, uid, gid
        self.home, self.dash, self.ext = home, dash, ext

    def __repr__(self):
        return "Recipient(%r, %d, %d, %r, %r, %r)" % (
            self.user, self.uid, self.gid, self.home, self.dash, self.ext)

    def __eq__(self, other):
        return isinstance(other, Recipient) and all(
            getattr(self, a) == getattr(other, a) for a in self.__slots__)


# --- users/assign: qmail-newu's reading of it -----------------------------

def parse_assign(data):
    """[(key, value)] exactly as qmail-newu would store them, wildcard key last.

    '=' lines (any first character other than '+') give key '!' + local +
    NUL; '+' lines give '!' + prefix; both lowercased. The value is the
    first six ':'-terminated fields joined by NUL. A line that is just '.'
    (or begins with '.') ends the file; reaching the end without it is a
    format error, as in qmail-newu.
    """
    items = []
    wildchars = bytearray()
    pos = 0
    while True:
        end = data.find(b"\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        if line.startswith(b"."):
            break
        if end < 0:
            raise AssignError("users/assign does not end with a line '.'")
        pos = end + 1
        if b"\0" in line:
            raise AssignError("NUL byte in users/assign")
        colon = line.find(b":")
        if colon <= 0:
            raise AssignError("line without an address field in users/assign")
        if line[:1] == b"+":
            key = b"!" + line[1:colon].lower()
            if colon >= 2 and line[colon - 1] not in wildchars:
                wildchars.append(line[colon - 1])
        else:
            key = b"!" + line[1:colon].lower() + b"\0"
        fields = line[colon + 1:].split(b":")
        if len(fields) < 7:                 # six terminating colons needed
            raise AssignError("line with fewer than six fields in users/assign")
        items.append((key, b"\0".join(fields[:6])))
    items.append((b"", bytes(wildchars)))
    return items


class _AssignTable:
    """users/assign parsed, answering like a cdb: the first entry for a key wins."""

    def __init__(self, items):
        self._map = {}
        for key, value in items:
            self._map.setdefault(key, value)

    def get(self, key, default=None):
        return self._map.get(key, default)


def compile_assign(home):
    """qmail-newu: build users/cdb from users/assign (users/cdb.tmp, fsync, rename).

    Raises OSError when users/assign cannot be read, AssignError on bad format.
    """
    with open(os.path.join(home, ASSIGN), "rb") as f:
        items = parse_assign(f.read())
    old = os.umask(0o033)
    try:
        cdb.build(os.path.join(home, CDB), items)
    finally:
        os.umask(old)


def _open_table(home):
    """users/cdb, else users/assign parsed, else None. LookupFailure(117) on trouble."""
    try:
        return cdb.CDB.open(os.path.join(home, CDB))
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        raise LookupFailure(QLX_CDB, "unable to read users/cdb: %s" % e) from e
    try:
        with open(os.path.join(home, ASSIGN), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LookupFailure(QLX_CDB, "unable to read users/assign: %s" % e.strerror) from e
    try:
        return _AssignTable(parse_assign(data))
    except AssignError as e:
        raise LookupFailure(QLX_CDB, str(e)) from e


def _table_lookup(table, local):
    """qmail-lspawn's nughde_get() search; the raw value or None."""
    try:
        wildchars = table.get(b"")
        if wildchars is None:               # qmail-lspawn: a cdb without the key is broken
            raise LookupFailure(QLX_CDB, "users/cdb has no wildcard entry")
        lower = b"!" + local.lower() + b"\0"
        value = table.get(lower)
        if value is not None:
            return value
        for i in range(len(lower) - 1, 0, -1):
            if i == 1 or lower[i - 1] in wildchars:
                value = table.get(lower[:i])
                if value is not None:
                    return value + local[i - 1:]
    except ValueError as e:                 # a damaged cdb
        raise LookupFailure(QLX_CDB, "unable to read users/cdb: %s" % e) from e
    return None


def _scan_ulong(field):
    digits = 0
    for ch in field:
        if not 48 <= ch <= 57:
            break
        digits = digits * 10 + ch - 48
    return digits


def _recipient(value):
    fields = value.split(b"\0")
    if len(fields) < 6:
        raise LookupFailure(QLX_USAGE, "user entry with fewer than six fields")
    user, uid, gid, home, dash, ext = fields[:6]
    return Recipient(user, _scan_ulong(uid), _scan_ulong(gid), home, dash, ext)


# --- the passwd database: qmail-getpw --------------------------------------

def _getpw(local):
    import pwd
    for end in range(len(local), -1, -1):
        if end >= GETPW_USERLEN or not (end == len(local) or local[end] == 0x2D):
            continue
        name = local[:end].lower()
        try:
            pw = pwd.getpwnam(os.fsdecode(name))
        except (KeyError, ValueError):
            continue
        if pw.pw_uid == 0:
            continue
        try:
            st = os.stat(pw.pw_dir)
        except OSError as e:
            from qmailpy.local.errors import error_temp
            if error_temp(e):
                raise LookupFailure(QLX_NFS, "unable to stat %s" % pw.pw_dir) from e
            continue
        if st.st_uid != pw.pw_uid:
            continue
        if end < len(local):
            dash, ext = b"-", local[end + 1:]
        else:
            dash, ext = b"", b""
        return Recipient(os.fsencode(pw.pw_name), pw.pw_uid, pw.pw_gid,
                         os.fsencode(pw.pw_dir), dash, ext)
    return None


def _alias(home, local):
    from qmailpy import privs
    try:
        acct = privs.account(home, "alias")
    except privs.PrivError as e:
        raise LookupFailure(QLX_NOALIAS, str(e)) from e
    return Recipient(os.fsencode(acct.name), acct.uid, acct.gid,
                     os.fsencode(os.path.join(os.path.abspath(home), "alias")), b"-", local)


def lookup(home, local):
    """The Recipient for a local part (bytes, original case)."""
    table = _open_table(home)
    if table is not None:
        value = _table_lookup(table, local)
        if value is not None:
            return _recipient(value)
    return getpw(home, local)


def getpw(home, local):
    """Steps 2-3 alone: qmail-getpw's answer for a local part (bytes, original case)."""
    found = _getpw(local)
    if found is not None:
        return found
    return _alias(home, local)

