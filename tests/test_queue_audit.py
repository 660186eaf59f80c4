"""qmail-audit on a real qmail-send's log and queue after every qmailctl queue action
(docs/qmail-send.md "Commands"; spark/): a held, released, requeued, bounced-now or deleted
message, and one left held, are not violations, on both backends."""
import json
import os
import re
import signal

import pytest

from delivery_support import wait_maildir
from knobs import AUDIT_COLLECT_ENV
from lspawn_harness import LocalUsers
from queue_commands_support import PEER, ctl, deferred_message, peer  # noqa: F401  (fixture)
from send_harness import Daemons

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


@pytest.fixture(scope="module")
def spark():
    from qmailpy.cli.qmail_audit import session
    s = session("local[2]", "qmail-audit-queue-actions")
    yield s
    s.stop()


def test_every_action_audits_clean(spark, qmail_home, peer, tmp_path, monkeypatch):  # noqa: F811
    from qmailpy_audit import job, messages
    collect = tmp_path / "collect"
    monkeypatch.setenv(AUDIT_COLLECT_ENV, str(collect))
    joe = LocalUsers(qmail_home).add("joe")
    daemons = Daemons(qmail_home).start()
    try:
        daemons.wait_started()
        released = deferred_message(qmail_home, daemons, peer, "ann")
        deleted_held = deferred_message(qmail_home, daemons, peer, "bob")
        bounced = deferred_message(qmail_home, daemons, peer, "cat")
        left_held = deferred_message(qmail_home, daemons, peer, "dan")
        deleted = deferred_message(qmail_home, daemons, peer, "eve")
        for action, numbers in (("hold", [released, deleted_held, left_held, bounced]),
                                ("release", [released]), ("delete", [deleted_held, deleted])):
            done = ctl(qmail_home, action, *map(str, numbers))
            assert done.returncode == 0, (action, done.stderr)
        peer.rcpt_replies.clear()
        assert ctl(qmail_home, "requeue", str(released)).returncode == 0
        assert ctl(qmail_home, "bounce", "--reason", "Moved away.", str(bounced)).returncode == 0
        daemons.wait_line(r"^end msg %d$" % released)
        daemons.wait_line(r"^end msg %d$" % bounced)
        wait_maildir(os.path.join(joe, "Maildir"), 1)           # the bounce
        daemons.signal(signal.SIGALRM)
        daemons.wait_idle(3)                                     # ann's, cat's, and the bounce
        assert daemons.stop() == 0
    finally:
        daemons.kill()
    lines = daemons.lines()
    assert "release msg %d" % bounced in lines and "delete msg %d" % deleted in lines
    assert not any(re.match(r"starting delivery \d+: msg %d " % left_held, l) for l in lines[-20:])

    home, = [p for p in collect.iterdir() if p.is_dir()]
    meta = json.loads((home / "meta.json").read_text())
    assert meta["errors"] == [] and meta["backend"] == qmail_home.backend
    result = job.audit(spark, [str(home / "send.log"), str(home / "queue.snapshot")],
                       str(tmp_path / "out"), job.Options(host_map=[(str(home), home.name)],
                                                          write_parquet=False))
    assert result.bad_inputs == [] and result.warnings == []
    assert result.violations == 0 and result.exit_code == 0, result.findings_by_kind
    notices = {k for k, severity in messages.FINDING_KINDS.items() if severity != messages.VIOLATION}
    assert set(result.findings_by_kind) <= notices
    assert result.findings_by_kind.get("never-ended") == 1               # dan's, still held
    by_kind = result.summary["log"]["by_kind"]
    assert (by_kind["hold msg"], by_kind["release msg"], by_kind["requeue msg"], by_kind["delete msg"],
            by_kind["bounce now"]) == (4, 2, 1, 2, 1)
