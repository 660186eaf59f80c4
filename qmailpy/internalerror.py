"""What a bug looks like to the administrator (docs/delivery.md "Internal errors").

An exception a program does not foresee is a bug of qmailpy's, never a mail-system
condition: the report names it ("internal error in qmail-remote: TypeError: ...", a
deferral, so the mail stays queued while the bug is fixed) and the traceback is written
where the administrator looks: qmail-send's log (the daemons' stderr, qmailpy.send.start)
or the program's stderr.

The traceback's text can hold what a hostile peer or sender chose (an address, a reply in
an exception's message), and in qmail-send's log it sits between lines the audit parses
(qmailpy.logline). So every line written here is 'PROGRAM: internal error: ...' or
'PROGRAM: | ...': printable ASCII only (anything else as its Python escape, \\x0b,
\\u2028), at most LINE_MAX bytes, never cut in the middle, and the '| ' keeps the rest of
the line from reading as a journald 'HOST IDENT: ' prefix followed by a qmail line.

traceback is imported only here and only when a bug happened: per-message programs
import this module and must stay fast to start.
"""
import os

PIPE_BUF = 4096             # a write to a pipe up to this size is not interleaved with others
SUMMARY_MAX = 300
LINE_MAX = 1000             # of one traceback line: each write holds whole lines


def summary(program, exc):
    """b'internal error in PROGRAM: TYPE: message' on one line, at most SUMMARY_MAX bytes."""
    return b"internal error in %s: %s" % (program.encode(), _named(exc))


def _named(exc):
    try:
        said = " ".join(str(exc).split())
    except Exception:           # a broken __str__ must not hide the first bug
        said = "<str() failed>"
    return printable(type(exc).__name__ + (": " + said if said else ""))[:SUMMARY_MAX]


def printable(text):
    """text as printable ASCII bytes: any other character as its Python escape."""
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text).encode("ascii")


def trace(program, exc):
    """'PROGRAM: internal error: TYPE: ...', then the traceback as 'PROGRAM: | ...' lines."""
    import traceback
    head = program.encode() + b": "
    lines = [head + b"internal error: " + _named(exc)]
    for line in "".join(traceback.format_exception(exc)).split("\n"):
        if line:
            lines.append(head + b"| " + printable(line)[:LINE_MAX])
    return b"".join(line + b"\n" for line in lines)


def tail(text, limit):
    """trace()'s text within limit bytes: its first line and as many whole lines of its
    end as fit (the end of a traceback says most)."""
    if len(text) <= limit:
        return text
    first = text[:text.find(b"\n") + 1]
    rest = text[len(first):]
    room = max(0, limit - len(first))
    return first + rest[rest.find(b"\n", len(rest) - room - 1) + 1:]


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


def daemon(program, body):
    """body()'s exit status; a bug in it is logged here and is 111. For the daemons whose
    stderr is qmail-send's log (qmail-lspawn, qmail-rspawn, qmail-clean): Python's own
    traceback would go there unprefixed, its exception's message a line of its own."""
    try:
        return body()
    except Exception as e:
        log(program, e)
        return 111


def log_if_bug(program, exc, expected):
    """log(program, exc) unless exc is one of the expected exception types."""
    if not isinstance(exc, expected):
        log(program, exc)
