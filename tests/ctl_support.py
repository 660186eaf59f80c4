"""Helpers for the tests of qmailctl with the real daemons: run qmailctl on a home, a free
TCP port, qmail-send's log as qmailctl writes it (HOME/log/qmail-send.log), and the
processes running in a home; qmailctl check's exit code and lines (check).
"""
import os
import socket

import psutil

from qmailpy import logline
from send_harness import Daemons


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ctl(home, *args):
    return home.run(["qmailctl", args[0], "--home", home.path] + list(args[1:]))


class LogFile(Daemons):
    """Daemons' log watching, pointed at HOME/log/qmail-send.log (qmailctl's log)."""

    def __init__(self, home):
        self.home = home
        self.logpath = os.path.join(home.path, "log", "qmail-send.log")
        self.proc = None
        self._inotify = None

    def lines(self):
        return [logline.parse(l).text for l in self.raw()]

    def raw(self):
        with open(self.logpath, "rb") as f:
            return [l.decode("utf-8", "surrogateescape") for l in f.read().split(b"\n")[:-1]]


def running_in(home):
    """Processes whose command line names the home (daemons, helpers, log writers)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE \
                and any(home.path in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def check(home):
    got = home.run(["qmailctl", "check", "--home", home.path])
    return got.returncode, got.stdout.decode().splitlines()
