"""Daemons with a planted bug, for the tests of what an administrator sees of one
(docs/delivery.md "Internal errors"; tests/test_internal_errors.py).

write_buggy_programs(home, *programs) writes DIR/PROGRAM for the programs named, of
qmail-rspawn, qmail-lspawn, qmail-send, qmail-smtpd, qmail-queue and qmail-qmqpd: each
runs the real program's main() after wrapping one internal function
of qmailpy to raise TypeError("planted bug") when one of its arguments holds the
marker (an address like bugged@...), or TypeError("planted bug for ARGUMENT") when it
holds ECHO: a bug whose message carries what a sender chose, as many do, or MemoryError
when it holds NOMEM. qmail-start finds its programs through PATH, so with DIR first on
PATH the daemons it starts are these. Nothing in qmailpy knows of this: the function is
replaced from outside, as a bug would be in it.
"""
import os
import sys

from send_harness import shared_dir

MARKER = b"bugged"
ECHO = b"bugged-echo"
NOMEM = b"bugged-nomem"     # MemoryError: a condition (ENOMEM), not a bug
TEXT = "planted bug"

# program -> (module, function wrapped, the program's main module)
PLANTS = {
    "qmail-rspawn": ("qmailpy.remote.deliver", "smtp_address", "qmailpy.cli.qmail_rspawn"),
    "qmail-lspawn": ("qmailpy.local.deliver", "_deliver", "qmailpy.cli.qmail_lspawn"),
    "qmail-send": ("qmailpy.send.loop", "verp", "qmailpy.cli.qmail_send"),
    "qmail-smtpd": ("qmailpy.smtpd.session", "addrparse", "qmailpy.cli.qmail_smtpd"),
    "qmail-queue": ("qmailpy.queue.qmailqueue", "write_all", "qmailpy.cli.qmail_queue"),
    "qmail-qmqpd": ("qmailpy.queue.qmailqueue", "write_all", "qmailpy.cli.qmail_qmqpd"),
}

PROGRAM = r'''#!%(python)s
import importlib, sys
sys.path[:0] = %(path)r
def plant():
    module = importlib.import_module(%(module)r)
    real = getattr(module, %(name)r)
    def planted(*args, **kwargs):
        for a in args:
            if isinstance(a, (bytes, bytearray)) and %(echo)r in a:
                raise TypeError(%(text)r + " for " + bytes(a).decode("utf-8", "surrogateescape"))
        if any(isinstance(a, (bytes, bytearray)) and %(nomem)r in a for a in args):
            raise MemoryError()
        if any(isinstance(a, (bytes, bytearray)) and %(marker)r in a for a in args):
            raise TypeError(%(text)r)
        return real(*args, **kwargs)
    setattr(module, %(name)r, planted)
plant()
from %(main)s import main
sys.exit(main())
'''


def write_buggy_programs(home, *programs, plants=PLANTS):
    """The directory holding the named programs (of plants) with a planted bug."""
    import qmailpy
    bindir = shared_dir(home, "bugbin")
    os.chmod(bindir, 0o755)
    source_dir = os.path.dirname(os.path.dirname(qmailpy.__file__))
    for program in programs:
        module, name, main = plants[program]
        path = os.path.join(bindir, program)
        with open(path, "w") as f:
            f.write(PROGRAM % {"python": sys.executable, "path": [source_dir], "module": module,
                               "name": name, "main": main, "marker": MARKER, "echo": ECHO,
                               "nomem": NOMEM, "text": TEXT})
        os.chmod(path, 0o755)
    return bindir


def buggy_env(home, *programs):
    """home.env with the named programs with a planted bug first on PATH."""
    env = dict(home.env)
    env["PATH"] = write_buggy_programs(home, *programs) + os.pathsep + env["PATH"]
    return env
