"""A bounce the queue refuses permanently is not retried for ever (docs/qmail-send.md "Bounces";
issue 25 point 3): qmail-send sends it once more without the copy of the message, and
discards it if that is refused too. The refusal comes from a qmail-queue replacement
($QMAILQUEUE, as a virus scanner would be) that refuses any message carrying a marker."""
import os
import shutil
import stat

import pytest

from delivery_support import maildir_messages, queue, wait_maildir
from lspawn_harness import LocalUsers
from send_harness import Daemons

pytestmark = pytest.mark.slow

MARKER = b"X-REFUSE-ME-PLEASE"

def scanner(home, refuse_all=False, refusal="exit 31"):
    path = os.path.join(home.path, "scanner")
    qmail_queue = shutil.which("qmail-queue", path=home.env["PATH"])
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                "# a qmail-queue replacement: refuse (31) a message carrying the marker, else queue it\n"
                'tmp=$(mktemp) || exit 53\n'
                'cat > "$tmp" || exit 54\n'
                '%s\n'
                'grep -q %s "$tmp" && { rm -f "$tmp"; %s; }\n'
                'exec 0< "$tmp"\n'
                'rm -f "$tmp"\n'
                "exec %s\n" % ('rm -f "$tmp"; exit 31' if refuse_all else ":",
                               MARKER.decode(), refusal, qmail_queue))
    os.chmod(path, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return path


def run_bounce(home, refuse_all=False, refusal="exit 31"):
    users = LocalUsers(home)
    bench = users.add("bench")
    daemons = Daemons(home, env=dict(home.env, QMAILQUEUE=scanner(home, refuse_all, refusal)))
    try:
        daemons.start()
        daemons.wait_line(r"^status: ")
        queue(home, b"bench@test.example", [b"nosuchuser@test.example"],
              b"Subject: carries the marker\n\n" + MARKER + b"\n")
        daemons.wait_line(r"^end msg ", 1 if refuse_all else 2)
        got = [] if refuse_all else wait_maildir(os.path.join(bench, "Maildir"), 1)
    finally:
        daemons.kill()
    return daemons.lines(), got, bench


def test_a_bounce_refused_for_its_copy_goes_without_it(qmail_home):
    lines, got, bench = run_bounce(qmail_home)
    refused = [l for l in lines if "permanently refused" in l]
    assert len(refused) == 1 and refused[0].endswith(
        " permanently refused (mail server permanently rejected message (#5.3.0)); sending it"
        " without the copy of the message"), lines
    assert not [l for l in lines if "trouble injecting bounce" in l], lines
    [bounce] = got
    assert b"Subject: failure notice\n" in bounce and b"<nosuchuser@test.example>:\n" in bounce
    assert MARKER not in bounce
    assert bounce.endswith(b"--- The copy of the message is left out: the queue refused it"
                           b" (mail server permanently rejected message (#5.3.0)).\n")


def test_a_bounce_refused_even_without_its_copy_is_discarded(qmail_home):
    lines, _, bench = run_bounce(qmail_home, refuse_all=True)
    refused = [l for l in lines if "permanently refused" in l]
    assert len(refused) == 2 and refused[1].endswith("; discarding it"), lines
    assert not [l for l in lines if "trouble injecting bounce" in l], lines
    assert maildir_messages(os.path.join(bench, "Maildir")) == []


def test_a_refusal_text_of_several_lines_stays_on_the_warning_line(qmail_home):
    """A scanner's own text (exit 82, the text on fd 6) may hold line ends: the warning
    that quotes it must not become several log lines (here, a forged 'status:' line)."""
    lines, got, _ = run_bounce(qmail_home, refusal=r"printf 'Dinfected\nstatus: forged\n' >&6; exit 82")
    assert not [l for l in lines if l.startswith("status: forged")], lines
    [refused] = [l for l in lines if "permanently refused" in l]
    assert "permanently refused (infected/status: forged/); sending it without" in refused, lines
    [bounce] = got
    assert MARKER not in bounce
