"""What a bug looks like to the administrator (docs/delivery.md "Internal errors").

An exception a program does not foresee is a bug of qmailpy's, never a mail-system
condition: the report names it ("internal error in qmail-remote: TypeError: ...", a
deferral, so the mail stays queued while the bug is fixed) and the traceback is written,
each line prefixed with the program's name, where the administrator looks: qmail-send's
log (the daemons' stderr, qmailpy.send.start) or the program's stderr.

traceback is imported only here and only when a bug happened: per-message programs
import this module and must stay fast to start.
"""
import os

PIPE_BUF = 4096             # a write to a pipe up to this size is not interleaved with others
SUMMARY_MAX = 300


def summary(program, exc):
    """b'internal error in PROGRAM: TYPE: message' on one line, at most SUMMARY_MAX bytes."""
    return b"internal error in %s: %s" % (program.encode(), _named(exc))


def _named(exc):
    said = " ".join(str(exc).split())
    text = type(exc).__name__ + (": " + said if said else "")
    return text.encode("utf-8", "backslashreplace")[:SUMMARY_MAX]


def trace(program, exc):
    """The traceback as lines prefixed 'PROGRAM: ', after 'PROGRAM: internal error: TYPE: ...'."""
    import traceback
    lines = [b"internal error: " + _named(exc)]
    for chunk in traceback.format_exception(exc):
        lines += chunk.encode("utf-8", "backslashreplace").splitlines()
    return b"".join(program.encode() + b": " + line + b"\n" for line in lines)


def write(fd, text):
    """text on fd in writes of whole lines up to PIPE_BUF bytes; an fd that takes nothing
    (closed, a reader gone) is no reason for a second failure."""
    while text:
        cut = text.rfind(b"\n", 0, PIPE_BUF) + 1 if len(text) > PIPE_BUF else len(text)
        chunk, text = text[:cut or PIPE_BUF], text[cut or PIPE_BUF:]
        try:
            while chunk:
                chunk = chunk[os.write(fd, chunk):]
        except OSError:
            return


def log(program, exc, fd=2):
    """The summary and traceback of exc on fd (the program's stderr)."""
    write(fd, trace(program, exc))


def log_if_bug(program, exc, expected):
    """log(program, exc) unless exc is one of the expected exception types."""
    if not isinstance(exc, expected):
        log(program, exc)
