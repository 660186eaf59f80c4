"""qmailctl init --mini HUB...: a mini-qmail home, qmail's null client (docs/protocols.md "Mini-qmail").

No queue and no daemons: control/ holds me, defaultdomain, plusdomain (as a full
home's) and qmqpservers (the hubs, in order), and HOME/bin holds the launchers of
every program, but bin/qmail-queue runs qmail-qmqpc, so that sendmail, qmail-inject
and every caller of qmail-queue hand each message to a hub by QMQP. The hubs must
accept this host in their control/qmqpclients (qmail-qmqpd(8)).
"""
import os
import sys

from qmailpy.home import MINI_MARK

QMQPC = ("qmailpy.cli.qmail_qmqpc", "main")


def run(args, home, fqdn):
    from qmailpy.ctl import launchers
    from qmailpy.ctl.init import control_files
    from qmailpy.fileio import write_all
    from qmailpy.queue.qmqpc import parse_server
    bad = [hub for hub in args.mini if parse_server(hub.encode()) is None]
    if bad:
        print("qmailctl init: --mini takes the hubs' IP addresses (as ADDRESS, ADDRESS:PORT or"
              " [IPV6]:PORT), not %s" % " ".join(bad), file=sys.stderr)
        return 1
    if os.path.exists(os.path.join(home, "queue")):
        print("qmailctl init: %s has a queue: a mini-qmail home has none (use another --home)"
              % home, file=sys.stderr)
        return 1
    wanted = {name: text for name, text in control_files(fqdn).items()
              if name in ("me", "defaultdomain", "plusdomain")}
    wanted[os.path.basename(MINI_MARK)] = "".join(hub + "\n" for hub in args.mini)
    try:
        os.makedirs(os.path.join(home, "control"), 0o755, exist_ok=True)
        for path in (home, os.path.join(home, "control")):
            # written by path: only a directory of ours (a root-made home) is safe for that
            if os.lstat(path).st_uid != os.geteuid():
                print("qmailctl init: %s is not owned by the user running qmailctl init" % path,
                      file=sys.stderr)
                return 1
        written = []
        for name, text in wanted.items():
            path = os.path.join(home, "control", name)
            replace = name == os.path.basename(MINI_MARK) or (name == "me" and args.me)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                             | (os.O_TRUNC if replace else os.O_EXCL), 0o644)
            except FileExistsError:
                continue
            try:
                write_all(fd, text.encode())
            finally:
                os.close(fd)
            written.append(name)
        programs = launchers.write(home)
        _point_qmail_queue_at_qmqpc(home, launchers)
    except (OSError, launchers.LauncherError) as e:
        print("qmailctl init: %s" % e, file=sys.stderr)
        return 1
    print("qmailctl init: %s: mini-qmail home (no queue), control files written: %s; %d programs"
          " in %s, qmail-queue is qmail-qmqpc to %s" % (
              home, " ".join(written) or "none", len(programs), os.path.join(home, "bin"),
              " ".join(args.mini)))
    return 0


def _point_qmail_queue_at_qmqpc(home, launchers):
    path = os.path.join(home, "bin", "qmail-queue")
    text = launchers.launcher_text(sys.executable, launchers.package_paths(), *QMQPC)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.rename(tmp, path)
