"""CRC-32C (Castagnoli), the checksum of the log backend's segment headers and records.

The crc32c package's C function when it is installed, else a table-driven
pure-Python definition (the two are checked against each other in the tests)."""
import os


def _load_native_crc32c():
    """The crc32c package's C function, loaded without running the package's __init__.

    That __init__ imports importlib.metadata and argparse (about 90 ms), too much for
    qmail-queue, which runs once per message; the extension module alone costs ~1 ms."""
    try:
        from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
        from importlib.util import find_spec, module_from_spec, spec_from_loader
        spec = find_spec("crc32c")
        for directory in (spec.submodule_search_locations or []) if spec else []:
            for suffix in EXTENSION_SUFFIXES:
                path = os.path.join(directory, "_crc32c" + suffix)
                if os.path.exists(path):
                    loader = ExtensionFileLoader("crc32c._crc32c", path)
                    module = module_from_spec(spec_from_loader("crc32c._crc32c", loader))
                    loader.exec_module(module)
                    return module.crc32c
    except (ImportError, OSError):
        pass
    try:
        from crc32c import crc32c as native
        return native
    except ImportError:
        return None


native_crc32c = _load_native_crc32c()


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = None


def crc32c_python(data, value=0):
    """Pure-Python CRC-32C (Castagnoli), for the benchmark and as a fallback."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _crc32c_table()
    table = _TABLE
    c = value ^ 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


crc32c = native_crc32c or crc32c_python
