"""Supervision: qmail-send started the way systemd/qmail-send.service starts it (its
ExecStart and Environment, /var/qmail replaced by a test home) exits 111 when one of
its helpers is killed (an OOM kill of qmail-lspawn or qmail-clean), so that the unit's
Restart=always brings it back; started again the same way, it carries on with the queue.
systemd itself cannot run here: the test is the supervisor, doing what Restart=always does."""
import os
import re
import shlex
import signal

import psutil
import pytest

from send_harness import Daemons

UNIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "systemd", "qmail-send.service")
DEFAULT_HOME = "/var/qmail"
LOST = {"qmail-lspawn": "alert: oh no! lost spawn connection! dying...",
        "qmail-rspawn": "alert: oh no! lost spawn connection! dying...",
        "qmail-clean": "alert: oh no! lost qmail-clean connection! dying..."}


def unit_settings(home):
    """(environment, ExecStart argv, Restart) of the unit, for this home."""
    with open(UNIT) as f:
        text = f.read().replace(DEFAULT_HOME, home.path)
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", text, re.M))
    argv = shlex.split(re.search(r"^ExecStart=(.*)$", text, re.M).group(1))
    restart = re.search(r"^Restart=(.*)$", text, re.M).group(1).strip()
    return env, argv, restart


class UnitDaemons(Daemons):
    """send_harness.Daemons, but with the unit's environment and command line."""

    def __init__(self, home):
        env, self.argv, self.restart = unit_settings(home)
        assert self.argv[0] == os.path.join(home.path, "bin", "qmail-start")
        super().__init__(home, defaultdelivery=self.argv[1], env=env)

    def start(self):
        start = super().start()
        assert self.proc.args == ["qmail-start", self.argv[1]]
        return start


@pytest.fixture
def unit(qmail_home):
    qmail_home.control("smtproutes", ":127.0.0.1:1\n")        # nothing listens: remote mail waits
    d = UnitDaemons(qmail_home)
    yield d
    d.kill()


def test_the_unit_restarts_qmail_send_whatever_ended_it(unit):
    assert unit.restart == "always"
    assert unit.env["PATH"].split(":")[0] == os.path.join(unit.home.path, "bin")


@pytest.mark.slow
@pytest.mark.both_backends
@pytest.mark.parametrize("helper", ["qmail-lspawn", "qmail-rspawn"])
def test_a_killed_spawner_ends_qmail_send_with_111_and_a_restart_comes_up(unit, helper):
    unit.start().wait_started()
    helpers = unit.daemons()
    helpers.pop("qmail-send")
    helpers[helper].kill()
    assert unit.proc.wait(timeout=60) == 111
    lines = unit.lines()
    assert LOST[helper] in lines and lines[-1] == "status: exiting", lines
    assert psutil.wait_procs(list(helpers.values()), timeout=30)[1] == []   # no helper left behind
    unit.start().wait_started()                                           # what Restart=always does
    assert set(unit.daemons()) >= {"qmail-send", "qmail-lspawn", "qmail-rspawn", "qmail-clean"}
    assert unit.stop() == 0


@pytest.mark.slow
@pytest.mark.dir_only
def test_a_killed_qmail_clean_ends_qmail_send_with_111_and_a_restart_finishes_the_job(unit):
    home = unit.home
    unit.start().wait_started()
    helpers = unit.daemons()
    helpers.pop("qmail-send")
    helpers["qmail-clean"].send_signal(signal.SIGKILL)     # a zombie until qmail-send ends
    # qmail-send notices when it next needs qmail-clean: to remove a preprocessed todo entry
    assert home.queue_message(b"Subject: x\n\ny\n", b"a@test.example", [b"b@elsewhere.example"]).returncode == 0
    assert unit.proc.wait(timeout=60) == 111
    lines = unit.lines()
    assert LOST["qmail-clean"] in lines and lines[-1] == "status: exiting", lines
    assert psutil.wait_procs(list(helpers.values()), timeout=30)[1] == []
    todo = [name for _, _, names in os.walk(os.path.join(home.queue, "todo")) for name in names]
    assert len(todo) == 1                                   # its todo entry is still there
    offset = unit.line_count()
    unit.start().wait_started()
    unit.wait_line(r"^new msg %s$" % todo[0], count=2)          # preprocessed again
    unit.wait_for(lambda l: any(x.startswith("starting delivery") for x in l[offset:]), 60,
                  "the restarted qmail-send delivers")
    assert not os.path.exists(os.path.join(home.queue, "todo", todo[0]))
    assert unit.stop() == 0
