"""qmail-inject [-nNaAhH] [-f sender] [-F name] [recip ...]: exit 0, 100 permanent, 111 temporary."""
import os
import sys

USAGE = "qmail-inject: usage: qmail-inject [ -nNaAhH ] [ -f sender ] [ -F name ] [ recip ... ]\n"


def main(argv=None):
    from qmailpy.fileio import open_std_fds
    from qmailpy.util.sgetopt import GetoptError, sgetopt
    stdin_closed = 0 in open_std_fds()
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, args = sgetopt(argv, "aAhHnNf:F:")
    except GetoptError:
        sys.stderr.write(USAGE)
        return 100
    from qmailpy.inject.run import ClosedInput, Options, inject
    options = Options(args=args)
    for letter, value in opts:
        if letter in "aAhH":
            options.strategy = letter
        elif letter == "n":
            options.queue = False
        elif letter == "N":
            options.queue = True
        elif letter == "f":
            options.sender = os.fsencode(value)
        elif letter == "F":
            options.name = value
    from qmailpy.home import qmail_home
    return inject(qmail_home(), options, os.environ, ClosedInput() if stdin_closed else sys.stdin.buffer,
                  sys.stdout.buffer, sys.stderr.buffer)


if __name__ == "__main__":
    sys.exit(main())
