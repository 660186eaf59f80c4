"""Every program has a manual page in man/, and mandoc's linter finds nothing at the
warning level or above (its style notes, such as a cross-reference to a page that is
not installed yet, are not faults)."""
import configparser
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAN = os.path.join(ROOT, "man")


def console_scripts():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = cfg.get("options.entry_points", "console_scripts").strip().splitlines()
    return sorted(line.split("=")[0].strip() for line in lines if line.strip())


def test_every_program_has_a_page():
    pages = {name.rsplit(".", 1)[0] for name in os.listdir(MAN)}
    missing = [p for p in console_scripts() if p not in pages]
    assert not missing, "no page in man/ for %s" % missing


@pytest.mark.skipif(shutil.which("mandoc") is None, reason="mandoc is not installed")
def test_mandoc_lint_is_clean_at_warning_level():
    pages = sorted(os.path.join(MAN, name) for name in os.listdir(MAN))
    done = subprocess.run(["mandoc", "-Tlint", "-W", "warning"] + pages, capture_output=True, text=True)
    faults = [l for l in (done.stdout + done.stderr).splitlines() if "mandoc.db" not in l]
    assert not faults, "\n".join(faults)


# qmail's manual pages that describe formats and the system rather than one program
MANUAL = ("addresses.5", "envelopes.5", "maildir.5", "mbox.5", "qmail-control.5", "qmail-header.5",
          "qmail-log.5", "tcp-environ.5", "forgeries.7", "qmail-limits.7", "qmail.7", "qmail-command.8")


def test_qmails_manual_pages_exist_and_name_themselves():
    for page in MANUAL:
        name, section = page.rsplit(".", 1)
        with open(os.path.join(MAN, page)) as f:
            text = f.read()
        assert ".Dt %s %s\n" % (name.upper(), section) in text, page
        assert ".Nm %s\n" % name in text, page


def test_pip_installs_every_section_in_man():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    installed = {value.strip() for _, value in cfg.items("options.data_files")}
    sections = {name.rsplit(".", 1)[1] for name in os.listdir(MAN)}
    assert {"man/*.%s" % s for s in sections} <= installed
