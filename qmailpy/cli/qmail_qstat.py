"""qmail-qstat: count the messages in the queue (docs/queue-format.md "qmail-qread and qmail-qstat").

Exit 0; 111 with `fatal: ...` on stdout when the queue cannot be read.
QMAILHOME selects the home; --home overrides it.
"""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from qmailpy.home import ControlError, qmail_home
    if argv and not (len(argv) == 2 and argv[0] == "--home"):
        sys.stderr.write("usage: qmail-qstat [--home DIR]\n")
        return 100
    home = qmail_home(argv[1] if argv else None)
    out = sys.stdout.buffer
    try:
        from qmailpy.ctl.qread import qstat_lines, queue_reader
        _, counts = queue_reader(home)
        out.writelines(qstat_lines(*counts()))
        out.flush()
    except BrokenPipeError:
        from qmailpy.fileio import stdout_gone
        return stdout_gone()
    except (OSError, ControlError, ValueError) as e:
        text = getattr(e, "strerror", None) or str(e)
        out.write(b"fatal: %s\n" % text.encode("utf-8", "replace"))
        out.flush()
        return 111
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
