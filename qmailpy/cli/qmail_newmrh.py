"""qmail-newmrh: compile control/morercpthosts into control/morercpthosts.cdb (qmail-newmrh(8)).

As qmail's: each line lowercased, trailing spaces, tabs and LF removed; empty
lines and lines starting with '#' left out; every host a key with an empty
value. qmail-smtpd consults the cdb after control/rcpthosts. The new cdb is
written beside the old one, fsynced and renamed over it, so a reader sees the
old table or the new one, never half of one. Everything in control/ is opened
through its descriptor without following symlinks (qmailpy.nofollow): root
runs this in a directory another account may own (a single-user home). Exit
0; 111 with a fatal message when the file cannot be read or the cdb cannot be
written (the old cdb then stays as it was); 100 for a bad argument.
"""
import os
import sys

FATAL = "qmail-newmrh: fatal: "
SOURCE, TARGET, TMP = "morercpthosts", "morercpthosts.cdb", "morercpthosts.cdb.tmp"
MODE = 0o644


def hosts(data):
    """The keys of morercpthosts.cdb from control/morercpthosts' bytes."""
    keys = []
    for line in data.split(b"\n"):
        line = line.lower().rstrip(b" \t\n")
        if line and not line.startswith(b"#"):
            keys.append(line)
    return keys


def _read(control):
    from qmailpy import nofollow
    fd = nofollow.open_file(SOURCE, control)
    with open(fd, "rb") as f:
        return f.read()


def _write(control, data):
    from qmailpy import nofollow
    from qmailpy.fileio import write_all
    try:
        os.unlink(TMP, dir_fd=control)
    except FileNotFoundError:
        pass
    fd = nofollow.open_file(TMP, control, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode=MODE)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(TMP, TARGET, src_dir_fd=control, dst_dir_fd=control)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and not (len(argv) == 2 and argv[0] == "--home"):
        sys.stderr.write("usage: qmail-newmrh [--home DIR]\n")
        return 100
    from qmailpy import nofollow
    from qmailpy.util import cdb
    from qmailpy.cli.qmail_tcpto import why
    from qmailpy.home import qmail_home
    home = qmail_home(argv[1] if argv else None)
    os.umask(0o033)
    try:
        control = nofollow.open_path(home, "control")
    except OSError as e:
        sys.stderr.write("%sunable to chdir to %s/control: %s\n" % (FATAL, home, why(e)))
        return 111
    try:
        try:
            data = _read(control)
        except OSError as e:
            sys.stderr.write("%sunable to read control/morercpthosts: %s\n" % (FATAL, why(e)))
            return 111
        try:
            _write(control, cdb.pack([(host, b"") for host in hosts(data)]))
        except OSError as e:
            sys.stderr.write("%sunable to write to control/morercpthosts.cdb.tmp: %s\n" % (FATAL, why(e)))
            return 111
    finally:
        os.close(control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
