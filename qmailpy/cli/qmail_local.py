"""qmail-local [-nN] user homedir local dash ext domain sender defaultdelivery

Argument parsing only; the delivery is qmailpy.local.deliver. The message is
on stdin, which must be seekable.
"""
import os
import sys


def parse(argv):
    """(flagdoit, the eight arguments as bytes) or None for a usage error (getopt "nN")."""
    flagdoit = True
    args = [os.fsencode(a) for a in argv]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == b"--":
            i += 1
            break
        if not arg.startswith(b"-") or arg == b"-":
            break
        for ch in arg[1:]:
            if ch == 0x6E:          # n
                flagdoit = False
            elif ch == 0x4E:        # N
                flagdoit = True
            else:
                return None
        i += 1
    rest = args[i:]
    if len(rest) != 8:
        return None
    return flagdoit, rest


def main(argv=None):
    from qmailpy.local import deliver
    parsed = parse(sys.argv[1:] if argv is None else argv)
    if parsed is None:
        os.write(2, deliver.USAGE + b"\n")
        return 100
    flagdoit, args = parsed
    return deliver.deliver(*args, flagdoit=flagdoit)


if __name__ == "__main__":
    sys.exit(main())
