"""qmail-newu: compile users/assign into users/cdb, the table qmail-lspawn reads.

Exit 0; 111 with a fatal message when users/assign cannot be read, has an
invalid format, or users/cdb cannot be written (users/cdb is then unchanged).
"""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and not (len(argv) == 2 and argv[0] == "--home"):
        sys.stderr.write("usage: qmail-newu [--home DIR]\n")
        return 100
    from qmailpy.home import qmail_home
    from qmailpy.local.users import AssignError, compile_assign
    home = qmail_home(argv[1] if argv else None)
    try:
        compile_assign(home)
    except AssignError:
        sys.stderr.write("qmail-newu: fatal: bad format in users/assign\n")
        return 111
    except OSError as e:
        if "assign" in str(e.filename or ""):
            sys.stderr.write("qmail-newu: fatal: unable to read users/assign\n")
        else:
            sys.stderr.write("qmail-newu: fatal: unable to write users/cdb.tmp\n")
        return 111
    return 0


if __name__ == "__main__":
    sys.exit(main())
