"""A fresh install ships a databytes limit (docs/submission.md "Size limits"; issue 23 point 3)."""
import os
import subprocess

import pytest

from qmailpy.sizelimits import SHIPPED_DATABYTES
from smtpd_support import SmtpdProcess

pytestmark = pytest.mark.slow


def databytes(home):
    with open(os.path.join(home.path, "control", "databytes")) as f:
        return f.read()


def test_qmailctl_init_ships_databytes_and_keeps_an_administrators_value(qmail_home):
    assert databytes(qmail_home) == "%d\n" % SHIPPED_DATABYTES == "26214400\n"
    qmail_home.control("databytes", "0\n")
    done = subprocess.run(["qmailctl", "init", "--home", qmail_home.path], env=qmail_home.env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert databytes(qmail_home) == "0\n"


def test_a_fresh_install_refuses_an_smtp_message_over_the_shipped_limit(qmail_home):
    with SmtpdProcess(qmail_home) as s:
        s.reply()
        assert b"250-SIZE 26214400\r\n" in s.command(b"EHLO client\r\n")
        assert s.command(b"MAIL FROM:<a@client.example> SIZE=26214401\r\n") == \
            b"552 sorry, that message size exceeds my databytes limit (#5.3.4)\r\n"
        assert s.command(b"MAIL FROM:<a@client.example> SIZE=26214400\r\n") == b"250 ok\r\n"
