"""Constant databases (cdb) as qmail uses them: users/cdb, morercpthosts.cdb (docs/control-files.md "cdb (users/cdb, morercpthosts.cdb)").

Little-endian u32 throughout: a 2048-byte header of 256 (table position, slot
count) pairs, the records (keylen, datalen, key, data), then 256 hash tables of
(hash, record position) slots.
"""
import os
import struct

_PAIR = struct.Struct("<II")


def cdb_hash(key):
    h = 5381
    for ch in key:
        h = (((h << 5) + h) & 0xFFFFFFFF) ^ ch
    return h


class CDB:
    """A read-only cdb loaded into memory (qmail's cdbs are small)."""

    def __init__(self, data):
        if len(data) < 2048:
            raise ValueError("cdb shorter than its 2048-byte header")
        self._data = data

    @classmethod
    def open(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

    def get_all(self, key):
        data = self._data
        h = cdb_hash(key)
        table_pos, slots = _PAIR.unpack_from(data, (h & 255) * 8)
        if slots == 0:
            return []
        found = []
        start = (h >> 8) % slots
        for i in range(slots):
            slot_pos = table_pos + ((start + i) % slots) * 8
            if slot_pos + 8 > len(data):
                raise ValueError("cdb hash table runs past the end of the file")
            slot_hash, record_pos = _PAIR.unpack_from(data, slot_pos)
            if record_pos == 0:
                break
            if slot_hash != h:
                continue
            if record_pos + 8 > len(data):
                raise ValueError("cdb record runs past the end of the file")
            klen, dlen = _PAIR.unpack_from(data, record_pos)
            kstart = record_pos + 8
            if data[kstart:kstart + klen] == key:
                found.append(data[kstart + klen:kstart + klen + dlen])
        return found

    def get(self, key, default=None):
        values = self.get_all(key)
        return values[0] if values else default

    def __contains__(self, key):
        return bool(self.get_all(key))


def pack(items):
    """The bytes of a cdb holding the (key, value) pairs."""
    records = bytearray(b"\0" * 2048)
    tables = [[] for _ in range(256)]
    for key, value in items:
        h = cdb_hash(key)
        tables[h & 255].append((h, len(records)))
        records += _PAIR.pack(len(key), len(value)) + key + value
    header = bytearray()
    for entries in tables:
        slots = len(entries) * 2
        header += _PAIR.pack(len(records), slots)
        table = [(0, 0)] * slots
        for h, pos in entries:
            i = (h >> 8) % slots
            while table[i][1] != 0:
                i = (i + 1) % slots
            table[i] = (h, pos)
        for h, pos in table:
            records += _PAIR.pack(h, pos)
    records[0:2048] = header
    return bytes(records)


def build(path, items):
    """Write (key, value) pairs as a cdb at path: path.tmp, fsync, rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(pack(items))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
