"""qmailctl queue [ACTION]: look at and act on the queue (docs/queue-operations.md).

Without an action: qmail-qread, then qmail-qstat (qmailpy/ctl/daemons.py). Each
action is a module of qmailpy/ctl with HELP, add_arguments(parser) and run(args);
those that select messages share qmailpy/ctl/queuefilter.py.
"""
import argparse
import importlib
import os
import sys

HELP = "look at the queue (list, size, shape) or act on it; alone: qmail-qread and qmail-qstat"

# action -> module under qmailpy.ctl
ACTIONS = {
    "list": "queuelist",
    "size": "queuesize",
    "shape": "queueshape",
    "delete": "queueact",
    "hold": "queueact",
    "release": "queueact",
    "requeue": "queueact",
    "bounce": "queueact",
}


def add_arguments(parser, name):
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    for action, module_name in ACTIONS.items():
        module = importlib.import_module("qmailpy.ctl." + module_name)
        p = sub.add_parser(action, help=module.HELP, description=module.HELP)
        p.add_argument("--home", default=argparse.SUPPRESS,
                       help="the qmail home (default $QMAILHOME or /var/qmail)")
        module.add_arguments(p)


def _denied(args):
    """True when this account may not reach queue/command (an ordinary user's qmailctl)."""
    from qmailpy.home import qmail_home
    cdir = os.path.join(qmail_home(getattr(args, "home", None)), "queue", "command")
    try:
        os.stat(cdir)
    except PermissionError:
        return True
    except OSError:
        return False                 # missing: the action says so
    return not os.access(cdir, os.W_OK | os.X_OK)


def run(args):
    if args.action is None:
        from qmailpy.ctl import daemons
        return daemons.queue(args)
    if ACTIONS[args.action] == "queueact" and _denied(args):
        print("qmailctl queue %s: permission denied: only root and qmail-send's account may act on"
              " the queue; nothing done" % args.action, file=sys.stderr)
        return 1
    if args.action == "delete":
        from qmailpy.ctl import queueoffline      # while qmail-send is down; else None
        status = queueoffline.run(args)
        if status is not None:
            return status
    return importlib.import_module("qmailpy.ctl." + ACTIONS[args.action]).run(args)
