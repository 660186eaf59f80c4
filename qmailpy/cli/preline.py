"""preline [-frdFRD] cmd [arg ...]: feed cmd the message with $UFLINE, $RPLINE and $DTLINE
first (docs/delivery.md "Delivery helpers"; preline(1)).

-f, -r, -d leave out the From_, Return-Path and Delivered-To line; -F, -R, -D put
it back. The three variables, which qmail-local sets, must all be present. The
exit code is cmd's; qmail-local maps it (100, 64, 65, 70, 76, 77, 78, 112
permanent, 99 stop, others temporary). cmd that stops reading early gets no
more: preline still reports its exit code.
"""
import errno
import os
import sys

from qmailpy.helpers.common import fatal, run_main, spawn, wait
from qmailpy.local.errors import Failure, error_str, error_temp

PROG = b"preline"
USAGE = b"preline: usage: preline cmd [ arg ... ]"
_CHUNK = 65536
_LINES = {0x66: b"UFLINE", 0x72: b"RPLINE", 0x64: b"DTLINE"}     # f r d


def parse(args):
    """(set of variables to leave out, cmd argv) or None for a usage error (getopt "frdFRD")."""
    omit = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == b"--":
            i += 1
            break
        if not arg.startswith(b"-") or arg == b"-":
            break
        for ch in arg[1:]:
            if ch in _LINES:
                omit.add(_LINES[ch])
            elif ch + 32 in _LINES:                         # F R D
                omit.discard(_LINES[ch + 32])
            else:
                return None
        i += 1
    return (omit, args[i:]) if i < len(args) else None


def _copy(head, fd):
    """Write head and then stdin to fd; False when the reader went away."""
    from qmailpy.fileio import write_all
    data = head
    while True:
        try:
            write_all(fd, data)
        except OSError as e:
            if e.errno == errno.EPIPE:
                return False
            raise Failure(111, fatal(PROG, b"unable to copy input: ", error_str(e))) from e
        try:
            data = os.read(0, _CHUNK)
        except OSError as e:
            raise Failure(111, fatal(PROG, b"unable to copy input: ", error_str(e))) from e
        if not data:
            return True


def preline(args):
    values = {name: os.environb.get(name) for name in (b"UFLINE", b"RPLINE", b"DTLINE")}
    parsed = parse(args)
    if None in values.values() or parsed is None:
        raise Failure(100, USAGE)
    omit, cmd = parsed
    head = b"".join(values[name] for name in (b"UFLINE", b"RPLINE", b"DTLINE") if name not in omit)
    try:
        read_end, write_end = os.pipe()
    except OSError as e:
        raise Failure(111, fatal(PROG, b"unable to create pipe: ", error_str(e))) from e
    pid, error = spawn(PROG, cmd, stdin=read_end)
    os.close(read_end)
    if pid is None:
        raise Failure(111 if error_temp(error) else 100,
                      fatal(PROG, b"unable to run ", cmd[0], b": ", error_str(error)))
    _copy(head, write_end)
    os.close(write_end)
    return wait(PROG, pid)


def main(argv=None):
    return run_main(preline, argv)


if __name__ == "__main__":
    sys.exit(main())
