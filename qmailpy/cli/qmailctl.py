"""qmailctl: manage a qmail home. Each subcommand lives in qmailpy/ctl/<name>.py."""
import argparse
import importlib
import sys

# subcommand -> module under qmailpy.ctl
SUBCOMMANDS = {
    "init": "init",
    "check": "check",
    "start": "daemons",
    "stop": "daemons",
    "stat": "daemons",
    "doqueue": "daemons",
    "reload": "daemons",
    "queue": "queuecmd",
    "snapshot": "snapshot",
    "convert": "convert",
    "services": "services",
    "dkim": "dkim",
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="qmailctl", description="manage a qmail home")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    command = next((a for a in argv if not a.startswith("-")), None)
    for name, module_name in SUBCOMMANDS.items():
        if name != command:
            sub.add_parser(name)
            continue
        try:
            module = importlib.import_module("qmailpy.ctl." + module_name)
        except ImportError as e:
            print("qmailctl: %s is not available: %s" % (name, e), file=sys.stderr)
            return 2
        p = sub.add_parser(name, help=getattr(module, "HELP", None))
        p.add_argument("--home", help="the qmail home (default $QMAILHOME or /var/qmail)")
        module.add_arguments(p, name)
        p.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        from qmailpy.fileio import stdout_gone
        return stdout_gone()


if __name__ == "__main__":
    sys.exit(main())
