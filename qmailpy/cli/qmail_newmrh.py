"""qmail-newmrh: compile control/morercpthosts into control/morercpthosts.cdb (qmail-newmrh(8)).

As qmail's: each line lowercased, trailing spaces, tabs and LF removed; empty
lines and lines starting with '#' left out; every host a key with an empty
value. qmail-smtpd consults the cdb after control/rcpthosts. The new cdb is
written beside the old one, fsynced and renamed over it, so a reader sees the
old table or the new one, never half of one. Exit 0; 111 with a fatal message
when the file cannot be read or the cdb cannot be written (the old cdb then
stays as it was); 100 for a bad argument.
"""
import os
import sys

FATAL = "qmail-newmrh: fatal: "


def hosts(data):
    """The keys of morercpthosts.cdb from control/morercpthosts' bytes."""
    keys = []
    for line in data.split(b"\n"):
        line = line.lower().rstrip(b" \t\n")
        if line and not line.startswith(b"#"):
            keys.append(line)
    return keys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and not (len(argv) == 2 and argv[0] == "--home"):
        sys.stderr.write("usage: qmail-newmrh [--home DIR]\n")
        return 100
    from qmailpy import cdb
    from qmailpy.home import qmail_home
    from qmailpy.local.errors import error_str
    home = qmail_home(argv[1] if argv else None)
    os.umask(0o033)
    source = os.path.join(home, "control", "morercpthosts")
    try:
        with open(source, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.stderr.write("%sunable to read control/morercpthosts: %s\n" % (FATAL, error_str(e).decode()))
        return 111
    target = source + ".cdb"
    try:
        cdb.build(target, [(host, b"") for host in hosts(data)])
    except OSError as e:
        sys.stderr.write("%sunable to write to control/morercpthosts.cdb.tmp: %s\n" % (FATAL, error_str(e).decode()))
        return 111
    return 0


if __name__ == "__main__":
    sys.exit(main())
