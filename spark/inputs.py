"""Finding, classifying and naming the audit's inputs (local paths or Hadoop URIs).

Each INPUT argument is a file, a directory (every non-hidden file below it), a
glob, or a qmail home (a local directory holding queue/: snapshotted on the
spot, with its log-backend segments and the qmail-send log that `qmailctl
start` writes in HOME/log, rotated files included, oldest first). A `KIND:` prefix (log:, snapshot:, notqmail:, segment:) forces the kind;
otherwise the first bytes decide: '{' = snapshot JSON lines, '# qmail queue
snapshot' = a notqmail text dump, a NUL byte = a log-backend segment, anything
else = a qmail-send log, unless its first line is qmail-qmqpd's (kind qmqpd: only its
`qmqp from` lines are read, for --fleet). A gzip file (magic 1f 8b, as logrotate leaves rotated
logs, whatever its name) is sniffed and read by its decompressed text.

Hosts: --host NAME=PATH names everything at or below PATH; otherwise a
journald line carries its own host, and any other file belongs to the host
named like its directory (a directory argument: that directory).
"""
import gzip
import io
import os
import socket
import zlib

KINDS = ("log", "snapshot", "notqmail", "segment", "home", "qmqpd")
HEAD_BYTES = 512
GZIP_MAGIC = b"\x1f\x8b"
GZIP_HEAD_BYTES = 65536     # compressed bytes read to see the first decompressed ones


class InputFile:
    __slots__ = ("path", "kind", "host", "order", "gzip")

    def __init__(self, path, kind, host, order, gzip=False):
        self.path, self.kind, self.host, self.order = path, kind, host, order
        self.gzip = gzip

    def __repr__(self):
        return "InputFile(%r, %r, %r)" % (self.path, self.kind, self.host)


class BadInput:
    __slots__ = ("kind", "path", "detail")

    def __init__(self, kind, path, detail):
        self.kind, self.path, self.detail = kind, path, detail

    def as_dict(self):
        return {"kind": self.kind, "path": self.path, "detail": self.detail}


def split_kind(spec):
    head, sep, rest = spec.partition(":")
    if sep and head in KINDS and head != "home":
        return head, rest
    return None, spec


def parse_host_map(pairs):
    """[(prefix, name)] from NAME=PATH strings, longest prefix first."""
    out = []
    for pair in pairs or ():
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError("--host wants NAME=PATH, got %r" % pair)
        out.append((_normal(path), name))
    return sorted(out, key=lambda p: -len(p[0]))


def _normal(path):
    """A local path (file: URIs included) made absolute; other URIs unchanged."""
    if path.startswith("file:"):
        path = path[len("file:"):]
        while path.startswith("//"):
            path = path[1:]
        return path
    if "://" in path:
        return path
    return os.path.abspath(path)


def host_for(path, default, host_map):
    local = _normal(path)
    for prefix, name in host_map:
        if local == prefix or local.startswith(prefix.rstrip("/") + "/"):
            return name
    return default


def sniff(head):
    if head.startswith(b"QMAILLOG"):
        return "segment"
    if head.startswith(b"{"):
        return "snapshot"
    if head.startswith(b"# qmail queue snapshot"):
        return "notqmail"
    if b"\0" in head:
        return "segment"
    if _is_qmqpd_log(head):
        return "qmqpd"
    return "log"


def _is_qmqpd_log(head):
    """qmail-qmqpd's own log (its `qmqp from` lines name QMQP clients: spark/fleet.py)."""
    from qmailpy.logline import parse_prefix
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    return parse_prefix(first)[2].startswith("qmail-qmqpd: ")


def gunzip_head(data):
    """The first decompressed bytes of the start of a gzip file (b"" if none come out)."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, HEAD_BYTES)
    except zlib.error:
        return b""


def gzip_lines(data):
    """(index, line) of a whole gzip file's text, decompressed as it is read."""
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
        for index, raw in enumerate(f):
            yield index, raw.decode("utf-8", "replace").rstrip("\r\n")


def is_home(path):
    return ("://" not in path and not path.startswith("file:")
            and os.path.isdir(os.path.join(path, "queue", "mess")))


def resolve(sc, specs, host_map):
    """(InputFile list, BadInput list) for the INPUT arguments."""
    jvm = sc._jvm
    conf = sc._jsc.hadoopConfiguration()
    files, bad = [], []
    order = 0
    for spec in specs:
        forced, target = split_kind(spec)
        if forced is None and is_home(target):
            files.append(InputFile(os.path.abspath(target), "home",
                                   host_for(target, socket.gethostname(), host_map), order))
            order += 1
            continue
        try:
            hpath = jvm.org.apache.hadoop.fs.Path(target)
            fs = hpath.getFileSystem(conf)
            statuses = fs.globStatus(hpath)
        except Exception as e:                      # py4j wraps every Java exception
            bad.append(BadInput("unreadable-path", target, _java_message(e)))
            continue
        if not statuses:
            bad.append(BadInput("unreadable-path", target, "no such file or directory"))
            continue
        for status in sorted(statuses, key=lambda s: s.getPath().toString()):
            found = []
            if status.isDirectory():
                dir_name = status.getPath().getName()
                try:
                    it = fs.listFiles(status.getPath(), True)
                    while it.hasNext():
                        st = it.next()
                        name = st.getPath().getName()
                        if not name.startswith((".", "_")):
                            found.append((st.getPath().toString(), dir_name))
                except Exception as e:
                    bad.append(BadInput("unreadable-path", status.getPath().toString(),
                                        _java_message(e)))
                    continue
                found.sort()
            else:
                found.append((status.getPath().toString(), status.getPath().getParent().getName()))
            for path, dir_name in found:
                try:
                    stream = fs.open(jvm.org.apache.hadoop.fs.Path(path))
                    try:
                        head = bytes(stream.readNBytes(HEAD_BYTES))
                        compressed = head.startswith(GZIP_MAGIC)
                        if compressed:
                            head = gunzip_head(head + bytes(stream.readNBytes(
                                GZIP_HEAD_BYTES - len(head))))
                    finally:
                        stream.close()
                except Exception as e:
                    bad.append(BadInput("unreadable-path", path, _java_message(e)))
                    continue
                kind = forced or sniff(head)
                if compressed and kind in ("segment", "notqmail"):
                    bad.append(BadInput("unreadable-path", path, "a gzip-compressed %s: "
                                        "decompress it first" % kind))
                    continue
                files.append(InputFile(path, kind, host_for(path, dir_name, host_map), order,
                                       compressed))
                order += 1
    return files, bad


def _java_message(e):
    text = str(e)
    for line in text.splitlines():
        if "Exception:" in line:
            return line.split("Exception:", 1)[1].strip() or line.strip()
    return text.splitlines()[0] if text else e.__class__.__name__
