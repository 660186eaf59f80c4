"""cdb bytes built by hand from the format description (docs/control-files.md "cdb (users/cdb, morercpthosts.cdb)"), then read back."""
import struct

from qmailpy.util import cdb


def test_hash_of_a_is_djb_hash():
    # 5381 * 33 = 177573; 177573 XOR ord('a') = 177604
    assert cdb.cdb_hash(b"a") == 177604


def test_single_record_file_is_byte_exact(tmp_path):
    path = str(tmp_path / "x.cdb")
    cdb.build(path, [(b"a", b"b")])
    h = 177604                                   # table h & 255 = 196, start slot (h >> 8) % 2 = 1
    header = b""
    for table in range(256):
        if table < 196:
            header += struct.pack("<II", 2058, 0)
        elif table == 196:
            header += struct.pack("<II", 2058, 2)
        else:
            header += struct.pack("<II", 2074, 0)
    expected = header + struct.pack("<II", 1, 1) + b"ab" + struct.pack("<IIII", 0, 0, h, 2048)
    with open(path, "rb") as f:
        assert f.read() == expected


def test_lookup_many_keys_and_duplicates(tmp_path):
    path = str(tmp_path / "users.cdb")
    items = [(b"!user%d\0" % i, b"value%d" % i) for i in range(500)] + [(b"dup", b"1"), (b"dup", b"2")]
    cdb.build(path, items)
    db = cdb.CDB.open(path)
    for key, value in items[:500]:
        assert db.get(key) == value
    assert db.get_all(b"dup") == [b"1", b"2"]
    assert db.get(b"absent") is None
    assert b"!user7\0" in db
