"""sendmail called exactly as the programs that use /usr/sbin/sendmail call it (docs/submission.md "sendmail")."""
import re

import pytest

from queue_view import queued
from smtpd_support import env, mess_count

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def sendmail(home, args, message, argv0="sendmail", **extra):
    return home.run([argv0, *args], input=message, env=env(home, **extra))


def only(home):
    [m] = queued(home)
    return m


def header_lines(m):
    return m.body_after_received(1).split(b"\n\n", 1)[0].split(b"\n")


def test_cron(qmail_home):
    # cronie: execl(sendmail, "-FCronDaemon", "-i", "-B8BITMIME", "-oem", mailto)
    msg = (b"From: root (Cron Daemon)\nTo: root\nSubject: Cron <root@host> run-parts\n"
           b"MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\n"
           b"X-Cron-Env: <SHELL=/bin/sh>\n\noutput of the job\n")
    done = sendmail(qmail_home, ["-FCronDaemon", "-i", "-B8BITMIME", "-oem", "root"], msg,
                    USER="root")
    assert done.returncode == 0, done.stderr
    m = only(qmail_home)
    assert (m.sender, m.recipients) == (b"root@test.example", [b"root@test.example"])
    lines = header_lines(m)
    assert b"From: root@test.example (Cron Daemon)" in lines
    assert b"To: root@test.example" in lines
    assert m.mess.endswith(b"\n\noutput of the job\n")


def test_cron_without_from_gets_the_f_name(qmail_home):
    done = sendmail(qmail_home, ["-FCronDaemon", "-i", "-B8BITMIME", "-oem", "joe"],
                    b"Subject: job\n\nout\n", USER="root")
    assert done.returncode == 0, done.stderr
    assert b'From: "CronDaemon" <root@test.example>' in header_lines(only(qmail_home))


def test_mailx(qmail_home):
    # bsd-mailx / s-nail: sendmail -i -- recipients; header from the user agent, no From
    msg = b"To: ann@a.example, bob\nSubject: from mailx\n\nhello\n"
    done = sendmail(qmail_home, ["-i", "--", "ann@a.example", "bob"], msg)
    assert done.returncode == 0, done.stderr
    m = only(qmail_home)
    assert m.sender == b"joe@test.example"
    assert m.recipients == [b"ann@a.example", b"bob@test.example"]
    lines = header_lines(m)
    assert lines[2] == b"From: joe@test.example"
    assert b"To: ann@a.example, bob@test.example" in lines


def test_git_send_email(qmail_home):
    # git send-email --smtp-server=/usr/sbin/sendmail: -i, -f envelope sender, recipients
    msg = (b"From: Dev Eloper <dev@d.example>\nTo: list@l.example\nCc: rev@r.example\n"
           b"Subject: [PATCH] fix\nDate: Mon, 1 Jan 2024 10:00:00 +0100\n"
           b"Message-Id: <20240101.1-1-dev@d.example>\nX-Mailer: git-send-email 2.43.0\n"
           b"MIME-Version: 1.0\nContent-Transfer-Encoding: 8bit\n\n---\n.\n-- \n2.43.0\n")
    done = sendmail(qmail_home, ["-i", "-f", "dev@d.example", "list@l.example", "rev@r.example"],
                    msg)
    assert done.returncode == 0, done.stderr
    m = only(qmail_home)
    assert m.sender == b"dev@d.example"
    assert m.recipients == [b"list@l.example", b"rev@r.example"]
    body = m.body_after_received(1)
    assert body.startswith(b"From: Dev Eloper <dev@d.example>\nTo: list@l.example\n")
    assert body.endswith(b"\n\n---\n.\n-- \n2.43.0\n")
    assert not any(l.startswith(b"Date: ") and l != b"Date: Mon, 1 Jan 2024 10:00:00 +0100"
                   for l in header_lines(m))


@pytest.mark.parametrize("extra", [[], ["-fbounces@site.example"]])
def test_php_mail(qmail_home, extra):
    # PHP mail(): sendmail_path "sendmail -t -i", headers on stdin (often with CRLF)
    msg = (b"To: customer@c.example\r\nSubject: Your order\r\nFrom: shop@site.example\r\n"
           b"Bcc: archive@site.example\r\nMIME-Version: 1.0\r\n\r\nThank you\r\n")
    done = sendmail(qmail_home, ["-t", "-i", *extra], msg, USER="www-data")
    assert done.returncode == 0, done.stderr
    m = only(qmail_home)
    assert m.recipients == [b"customer@c.example", b"archive@site.example"]
    assert m.sender == (b"bounces@site.example" if extra else b"www-data@test.example")
    body = m.body_after_received(1)
    assert b"archive@site.example" not in body
    assert b"Subject: Your order\r\n" in body and body.endswith(b"\r\n\r\nThank you\r\n")


def test_mutt(qmail_home):
    # mutt/neomutt: sendmail -oem -oi -- recipients
    msg = (b"Date: Mon, 1 Jan 2024 10:00:00 +0000\nFrom: Joe <joe@test.example>\n"
           b"To: Friend <friend@f.example>\nSubject: hi\nMessage-ID: <m@test.example>\n"
           b"User-Agent: Mutt\n\nbody\n")
    done = sendmail(qmail_home, ["-oem", "-oi", "--", "friend@f.example"], msg)
    assert done.returncode == 0, done.stderr
    m = only(qmail_home)
    assert (m.sender, m.recipients) == (b"joe@test.example", [b"friend@f.example"])
    assert m.body_after_received(1) == msg


def test_t_adds_header_recipients_to_the_arguments(qmail_home):
    done = sendmail(qmail_home, ["-t", "extra@e.example"], b"To: h@h.example\n\nb\n")
    assert done.returncode == 0, done.stderr
    assert only(qmail_home).recipients == [b"extra@e.example", b"h@h.example"]


def test_f_cancels_F_and_sets_user_and_host(qmail_home):
    done = sendmail(qmail_home, ["-F", "Ignored Name", "-f", "list-owner@lists.example", "r"],
                    b"\nb\n", NAME="Also Ignored")
    assert done.returncode == 0, done.stderr
    m = only(qmail_home)
    assert m.sender == b"list-owner@lists.example"
    assert b"From: list-owner@lists.example" in header_lines(m)


def test_ignored_options_are_accepted(qmail_home):
    args = ["-v", "-i", "-x", "-m", "-e", "q", "-p", "smtp", "-oi", "-odb", "-odi", "-B8BITMIME",
            "-E", "-Jjunk", "-bm", "-U", "-N", "never", "-R", "hdrs", "r@test.example"]
    done = sendmail(qmail_home, args, b"\nb\n")
    assert done.returncode == 0, done.stderr
    assert only(qmail_home).recipients == [b"r@test.example"]


@pytest.mark.parametrize("args", [["-Z"], ["-bz"], ["-f"], ["-bi"]])
def test_usage_errors_exit_ex_usage(qmail_home, args):
    done = sendmail(qmail_home, args, b"\nb\n")
    assert done.returncode == 64
    assert b"usage: sendmail" in done.stderr and b"Traceback" not in done.stderr
    assert mess_count(qmail_home) == 0


@pytest.mark.parametrize("message, args", [
    (b"From: <broken\n\nb\n", ["r@test.example"]),
    (b"Subject: no recipients\n\nb\n", ["-t"]),
    (b"\nb\n", ["<bad"]),
])
def test_malformed_input_exits_ex_dataerr_with_a_clear_message(qmail_home, message, args):
    done = sendmail(qmail_home, args, message)
    assert done.returncode == 65
    assert done.stderr.startswith(b"sendmail: fatal: ") and b"Traceback" not in done.stderr
    assert mess_count(qmail_home) == 0


def test_temporary_queue_failure_exits_ex_tempfail(qmail_home):
    import os
    script = os.path.join(qmail_home.path, "qq")
    with open(script, "w") as f:
        f.write("#!/bin/sh\ncat >/dev/null\nexit 53\n")
    os.chmod(script, 0o755)
    done = sendmail(qmail_home, ["r@test.example"], b"\nb\n", QMAILQUEUE=script)
    assert done.returncode == 75
    assert done.stderr == b"sendmail: fatal: qq write error or disk full (#4.3.0)\n"


def test_bs_runs_an_smtp_session_on_stdin_stdout(qmail_home):
    dialogue = (b"HELO me\r\nMAIL FROM:<joe@test.example>\r\nRCPT TO:<far@away.example>\r\n"
                b"DATA\r\nSubject: bs\r\n\r\nbody\r\n.\r\nQUIT\r\n")
    done = sendmail(qmail_home, ["-bs"], dialogue)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split(b"\r\n")
    assert lines[:5] == [b"220 test.example ESMTP", b"250 test.example", b"250 ok", b"250 ok",
                         b"354 go ahead"]
    assert re.match(rb"250 ok \d+ qp \d+\Z", lines[5])
    assert lines[6:] == [b"221 test.example", b""]
    m = only(qmail_home)
    assert m.recipients == [b"far@away.example"]            # RELAYCLIENT is set for -bs
    assert m.body_after_received(1).startswith(
        b"Received: from localhost (HELO me) (sendmail-bs@127.0.0.1)\n  by localhost with SMTP; ")


def test_bp_and_mailq_run_qmail_qread(qmail_home):
    expected = qmail_home.run(["qmail-qread"])
    assert expected.returncode == 0
    for argv0, args in (("sendmail", ["-bp"]), ("mailq", [])):
        done = sendmail(qmail_home, args, b"", argv0=argv0)
        assert (done.returncode, done.stdout) == (0, expected.stdout)


def test_newaliases_name_is_refused(qmail_home, tmp_path):
    import os
    import sys
    link = tmp_path / "newaliases"
    os.symlink(os.path.join(os.path.dirname(sys.executable), "sendmail"), link)
    done = sendmail(qmail_home, [], b"", argv0=str(link))
    assert done.returncode == 69
    assert done.stderr.startswith(b"sendmail: fatal: ")
