"""Recipient lookup (qmailpy.local.users): users/assign, users/cdb as qmail-newu builds it, passwd, alias."""
import os
import pwd
import struct

import pytest

from qmailpy.util import cdb
from qmailpy.local import users
from qmailpy.local.users import Recipient

ASSIGN = b"""=joe:joe:1001:1001:/home/joe:::
=Joe.Smith:joe:1001:1001:/home/joe:-:smith:
+list-:lists:1002:1002:/home/lists:-::
+list-big-:big:1003:1003:/home/big:-:b-:
+:catch:1004:1004:/home/catch:-:all-:
.
ignored after the dot
"""


@pytest.fixture
def home(tmp_path):
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "assign").write_bytes(ASSIGN)
    (tmp_path / "control").mkdir()
    return str(tmp_path)


def expected():
    return {
        b"joe": Recipient(b"joe", 1001, 1001, b"/home/joe", b"", b""),
        b"JOE": Recipient(b"joe", 1001, 1001, b"/home/joe", b"", b""),
        b"joe.smith": Recipient(b"joe", 1001, 1001, b"/home/joe", b"-", b"smith"),
        b"list-Foo": Recipient(b"lists", 1002, 1002, b"/home/lists", b"-", b"Foo"),
        b"LIST-big-Deal": Recipient(b"big", 1003, 1003, b"/home/big", b"-", b"b-Deal"),
        b"list-": Recipient(b"lists", 1002, 1002, b"/home/lists", b"-", b""),
        b"joey": Recipient(b"catch", 1004, 1004, b"/home/catch", b"-", b"all-joey"),
    }


def test_assign_lookup_without_cdb(home):
    for local, want in expected().items():
        assert users.lookup(home, local) == want, local


def test_compiled_cdb_gives_the_same_answers(home):
    users.compile_assign(home)
    path = os.path.join(home, "users", "cdb")
    assert os.stat(path).st_mode & 0o777 == 0o644
    db = cdb.CDB.open(path)
    # qmail-newu's records: '!' + lowercased local + NUL, '!' + prefix, wildcard chars under "".
    assert db.get(b"!joe.smith\0") == b"joe\x001001\x001001\x00/home/joe\x00-\x00smith"
    assert db.get(b"!list-") == b"lists\x001002\x001002\x00/home/lists\x00-\x00"
    assert db.get(b"") == b"-"
    os.unlink(os.path.join(home, "users", "assign"))     # the cdb alone answers now
    for local, want in expected().items():
        assert users.lookup(home, local) == want, local


def test_cdb_wins_over_assign(home):
    users.compile_assign(home)
    with open(os.path.join(home, "users", "assign"), "wb") as f:
        f.write(b"=joe:other:1:1:/x:::\n.\n")
    assert users.lookup(home, b"joe").user == b"joe"


def test_damaged_cdb_is_117(home):
    with open(os.path.join(home, "users", "cdb"), "wb") as f:
        f.write(b"short")
    with pytest.raises(users.LookupFailure) as info:
        users.lookup(home, b"joe")
    assert info.value.code == 117


@pytest.mark.parametrize("text", [
    b"=joe:joe:1:1:/home/joe:::\n",                   # no final '.'
    b"=joe:joe:1:1:/home/joe::\n.\n",                  # five fields
    b"joe\n.\n",                                       # no colon
    b":joe:1:1:/h:::\n.\n",                            # empty address field
])
def test_malformed_assign_is_117_and_refused_by_newu(home, text):
    with open(os.path.join(home, "users", "assign"), "wb") as f:
        f.write(text)
    with pytest.raises(users.LookupFailure) as info:
        users.lookup(home, b"joe")
    assert info.value.code == 117
    with pytest.raises(users.AssignError):
        users.compile_assign(home)
    assert not os.path.exists(os.path.join(home, "users", "cdb"))


def test_first_entry_wins(home):
    with open(os.path.join(home, "users", "assign"), "wb") as f:
        f.write(b"=joe:first:5:5:/a:::\n=joe:second:6:6:/b:::\n.\n")
    assert users.lookup(home, b"joe").user == b"first"
    users.compile_assign(home)
    os.unlink(os.path.join(home, "users", "assign"))
    assert users.lookup(home, b"joe").user == b"first"


def test_cdb_written_by_hand_matches_appendix_a(home):
    # An independent reading of the format: the header pair for the key's hash
    # points at a table whose probing finds the record.
    users.compile_assign(home)
    with open(os.path.join(home, "users", "cdb"), "rb") as f:
        data = f.read()
    key = b"!joe\0"
    h = 5381
    for c in key:
        h = ((h * 33) & 0xFFFFFFFF) ^ c
    pos, slots = struct.unpack_from("<II", data, (h & 255) * 8)
    i = (h >> 8) % slots
    while True:
        sh, rp = struct.unpack_from("<II", data, pos + i * 8)
        assert rp != 0
        klen, dlen = struct.unpack_from("<II", data, rp)
        if sh == h and data[rp + 8:rp + 8 + klen] == key:
            assert data[rp + 8 + klen:rp + 8 + klen + dlen] == b"joe\x001001\x001001\x00/home/joe\x00\x00"
            break
        i = (i + 1) % slots


def _passwd_user():
    """A passwd account qmail-getpw would accept (uid != 0, home owned by it), if any."""
    for pw in pwd.getpwall():
        if pw.pw_uid == 0 or len(pw.pw_name) >= 32 or "-" in pw.pw_name:
            continue
        try:
            if os.stat(pw.pw_dir).st_uid == pw.pw_uid:
                return pw
        except OSError:
            continue
    return None


def test_passwd_lookup_with_extension(tmp_path):
    pw = _passwd_user()
    if pw is None:
        pytest.skip("no passwd account with a home directory it owns")
    found = users.lookup(str(tmp_path), pw.pw_name.upper().encode() + b"-Some-Ext")
    assert found == Recipient(pw.pw_name.encode(), pw.pw_uid, pw.pw_gid, pw.pw_dir.encode(),
                              b"-", b"Some-Ext")
    found = users.lookup(str(tmp_path), pw.pw_name.encode())
    assert (found.dash, found.ext) == (b"", b"")


def test_passwd_root_and_homeless_accounts_are_skipped(qmail_home):
    # root is uid 0; nobody's home (/nonexistent) does not exist: both go to the alias user.
    for local in (b"root", b"nobody-x"):
        found = users.lookup(qmail_home.path, local)
        assert found == Recipient(qmail_home.user.encode(), qmail_home.uid, qmail_home.gid,
                                  os.path.join(qmail_home.path, "alias").encode(), b"-", local)


def test_no_alias_user_is_116(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "roles").write_text("alias:no-such-account-qmailpy\n")
    with pytest.raises(users.LookupFailure) as info:
        users.lookup(str(tmp_path), b"nobody-at-all-here")
    assert info.value.code == 116
