"""Choosing and reading a .qmail file (dot-qmail(5); docs/delivery.md "qmail-local").

Everything here runs in the recipient's home directory (qmail-local has
chdir'd there), so every name is relative: ``.qmail``, ``.qmail-ext``,
``.qmail-default`` and so on.
"""
import errno
import os
import stat

from qmailpy.local.errors import Failure, error_str, error_temp

# qmail's conf-patrn: the mode bits that make a home directory or a .qmail file refused
# ("paternalism"; qmail-showctl prints it in decimal).
PATERNALISM = 0o002


def safe_ext(ext):
    """The extension as it appears in file names: lowercased, '.' -> ':'."""
    return ext.lower().replace(b".", b":")


def _temp_open_failure(name, err):
    return Failure(111, b"Unable to open " + name + b": " + error_str(err) + b". (#4.3.0)")


def read_candidate(name):
    """(contents, forward_only) of a usable .qmail file, or None when it counts as absent.

    Absent: does not exist (or any open error that is not temporary, EPERM
    or EACCES), or is not a regular file. A regular file writable by others
    is refused; the owner-execute bit means "forward only".
    """
    try:
        # O_NONBLOCK: a FIFO named .qmail-x must not hang the delivery.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        if error_temp(e) or e.errno in (errno.EPERM, errno.EACCES):
            raise _temp_open_failure(name, e) from e
        return None
    try:
        try:
            st = os.fstat(fd)
        except OSError as e:
            raise _temp_open_failure(name, e) from e
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_mode & PATERNALISM:
            raise Failure(111, b"Uh-oh: .qmail file is writable. (#4.7.0)")
        forward_only = bool(st.st_mode & 0o100)
        chunks = []
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError as e:
                raise Failure(111, b"Unable to read " + name + b": " + error_str(e)
                              + b". (#4.3.0)") from e
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), forward_only
    finally:
        os.close(fd)


def find(dash, ext):
    """(name, contents, forward_only, default) of the .qmail file for dash+ext.

    name is None when no file applies. default is the value of $DEFAULT when
    a -default file matched, else None. Order for ext a-b-c: .qmail-a-b-c,
    .qmail-a-b-default, .qmail-a-default, .qmail-default.
    """
    safeext = safe_ext(ext)
    name = b".qmail" + dash + safeext
    found = read_candidate(name)
    if found is not None:
        default = None
        if len(safeext) >= 7 and safeext.endswith(b"default"):
            i = len(safeext) - 7
            if i <= len(ext):
                default = ext[i:]
        return name, found[0], found[1], default
    for i in range(len(safeext), -1, -1):
        if i and safeext[i - 1] != 0x2D:
            continue
        name = b".qmail" + dash + safeext[:i] + b"default"
        found = read_candidate(name)
        if found is not None:
            return name, found[0], found[1], (ext[i:] if i <= len(ext) else None)
    return None, None, False, None


def _exists(name):
    try:
        os.stat(name)
    except OSError as e:
        if error_temp(e):
            raise _temp_open_failure(name, e) from e
        return False
    return True


def new_sender(local, host, sender, dash, ext):
    """$NEWSENDER: the sender, or the list owner when .qmail-ext-owner exists."""
    if sender in (b"", b"#@[]"):
        return sender
    base = b".qmail" + dash + safe_ext(ext)
    if not _exists(base + b"-owner"):
        return sender
    if _exists(base + b"-owner-default"):
        return local + b"-owner-@" + host + b"-@[]"
    return local + b"-owner@" + host


COMMENT, MAILDIR, MBOX, PROGRAM, FORWARD, LIST, IGNORED = (
    "comment", "maildir", "mbox", "program", "forward", "list", "ignored")


def instructions(cmds):
    """[(kind, argument)] for each line, in order; blank lines after the first dropped.

    Trailing spaces and tabs are removed; a first line that is blank is
    refused (temporary failure), as qmail-local does.
    """
    if not cmds.endswith(b"\n"):
        cmds += b"\n"
    result = []
    for index, line in enumerate(cmds[:-1].split(b"\n")):
        line = line.rstrip(b" \t")
        if not line:
            if index == 0:
                raise Failure(111, b"Uh-oh: first line of .qmail file is blank. (#4.2.1)")
            continue
        first = line[:1]
        if first == b"#":
            result.append((COMMENT, line))
        elif first in (b".", b"/"):
            result.append((MAILDIR if line.endswith(b"/") else MBOX, line))
        elif first == b"|":
            result.append((PROGRAM, line[1:]))
        elif first == b"+":
            result.append((LIST if line == b"+list" else IGNORED, line))
        elif first == b"&":
            result.append((FORWARD, line[1:]))
        else:
            result.append((FORWARD, line))
    return result
