"""qmailctl services: service directories for daemontools' svscan/supervise (or runit's
runsvdir/runsv, which reads the same layout), so that without systemd a crashed daemon is
started again at once, as qmail itself is run.

Why service directories rather than a supervisor inside qmailctl: supervise is qmail's own
answer, small, already packaged (daemontools, runit), and it outlives any mistake of ours;
qmailctl only writes what it runs. Each directory DIR/NAME holds `run` (exports QMAILHOME
and a PATH with HOME/bin first when it is root's, then execs the daemon as `qmailctl start` would) and
`log/run` (qmailctl's log writer: HOME/log/NAME.log, stamped and rotated by control/logsize
and control/logcount, read again when they change). A supervised daemon has no pid file;
`qmailctl stat` finds it by its command line and QMAILHOME, and `qmailctl start` reports
it as already running. Stop one with `svc -d DIR/NAME` (runit: `sv down DIR/NAME`); to
remove one, take its directory out of svscan's sight first, then `svc -dx DIR/NAME DIR/NAME/log`
(svscan starts a new supervise for every directory it sees).
"""
import os
import shlex
import sys

from qmailpy.logfiles import LOG_DIR, QMQPD_LOG, SEND_LOG, SMTPD_LOG, SUBMISSION_LOG

HELP = "write daemontools/runit service directories for the home's daemons"
MARK = "# Written by qmailctl services (qmailpy.ctl.services)"


def add_arguments(parser, name):
    parser.add_argument("--dir", required=True, metavar="DIR",
                        help="where to write the service directories (e.g. /etc/service)")
    parser.add_argument("--smtp", metavar="HOST:PORT", help="also a qmail-smtpd-listen service")
    parser.add_argument("--submission", metavar="HOST:PORT",
                        help="also a submission listener (SMTPAUTH=!)")
    parser.add_argument("--defaultdelivery", default="./Maildir/",
                        help="qmail-start's default delivery (default ./Maildir/)")


def services(args):
    """[(service name, log name, argv, extra environment)] for this call."""
    wanted = [("qmail-qmqpd", QMQPD_LOG, ["qmail-qmqpd"], {}),
              ("qmail-send", SEND_LOG, ["qmail-start", args.defaultdelivery], {})]
    if args.smtp:
        wanted.append(("qmail-smtpd", SMTPD_LOG, ["qmail-smtpd-listen", args.smtp], {}))
    if args.submission:
        wanted.append(("qmail-submission", SUBMISSION_LOG, ["qmail-smtpd-listen", args.submission],
                       {"SMTPAUTH": "!"}))
    return wanted


def run_script(home, argv, extra):
    """supervise runs it as root: HOME/bin first on PATH only when root may run its
    programs (daemons._bin_is_roots; a single-user home's bin/ is its user's), else
    the directory of this installation's interpreter."""
    from qmailpy.ctl.daemons import _bin_is_roots
    from qmailpy.home import BIN
    first = os.path.join(home, BIN) if _bin_is_roots(home) else os.path.dirname(sys.executable)
    lines = ["#!/bin/sh", MARK + ": supervise(8) or runsv(8) runs it.", "exec 2>&1",
             "QMAILHOME=%s; export QMAILHOME" % shlex.quote(home),
             "PATH=%s:/usr/local/bin:/usr/bin:/bin; export PATH" % shlex.quote(first)]
    lines += ["%s=%s; export %s" % (k, shlex.quote(v), k) for k, v in sorted(extra.items())]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def log_script(home, logname):
    """The log writer started as HOME/bin's launchers start programs: python -IS with
    qmailpy's directories on sys.path (qmailpy/ctl/launchers.py)."""
    from qmailpy.ctl.launchers import package_paths
    from qmailpy.ctl.logwriter import limits
    code = "import sys; sys.path.extend(%r); from qmailpy.ctl.logwriter import main; sys.exit(main(sys.argv))" % (
        package_paths(),)
    size, count = limits(home)
    argv = [sys.executable, "-IS", "-c", code, os.path.join(home, LOG_DIR, logname), str(size), str(count),
            os.path.join(home, "control")]
    return "#!/bin/sh\n%s: the service's log.\nexec %s\n" % (MARK, " ".join(shlex.quote(a) for a in argv))


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def run(args):
    from qmailpy.ctl.launchers import LauncherError
    from qmailpy.home import qmail_home
    home = os.path.abspath(qmail_home(args.home))
    if not os.path.isfile(os.path.join(home, "control", "me")):
        print("qmailctl services: %s is not a qmail home (make one with: qmailctl init --home %s)"
              % (home, home), file=sys.stderr)
        return 1
    base = os.path.abspath(args.dir)
    try:
        os.makedirs(os.path.join(home, LOG_DIR), 0o755, exist_ok=True)
        for name, logname, argv, extra in services(args):
            service = os.path.join(base, name)
            os.makedirs(os.path.join(service, "log"), 0o755, exist_ok=True)
            # log/run first: svscan may start the service as soon as run appears
            _write(os.path.join(service, "log", "run"), log_script(home, logname))
            _write(os.path.join(service, "run"), run_script(home, argv, extra))
            print("%s: %s" % (service, " ".join(argv)))
    except (OSError, LauncherError) as e:
        print("qmailctl services: %s" % e, file=sys.stderr)
        return 1
    return 0
