"""qmail's administrator's tools: qmail-showctl, qmail-newmrh, qmail-tcpto, qmail-tcpok and
maildir2mbox, run as processes on a real home; their output compared byte for byte with what
qmail's programs print (qmail-showctl.c, qmail-tcpto.c, maildir2mbox.c)."""
import ipaddress
import os
import pwd
import grp
import re
import struct
import time

import pytest


from smtpd_support import SmtpdProcess

pytestmark = pytest.mark.slow


def ids(home):
    from qmailpy import privs
    roles = privs.load_roles(home.path)
    users = [roles[r] for r in ("alias", "qmaild", "qmaill")] + ["root"] + \
        [roles[r] for r in ("qmailp", "qmailq", "qmailr", "qmails")]
    return (", ".join(str(pwd.getpwnam(u).pw_uid) for u in users),
            ", ".join(str(grp.getgrnam(roles[g]).gr_gid) for g in ("nofiles", "qmail")))


def showctl(home):
    done = home.run(["qmail-showctl"])
    return done.returncode, done.stdout.decode("latin-1")


def test_showctl_prints_qmails_text_for_every_qmail_control_file(qmail_home):
    h = qmail_home
    for name, text in (("defaultdomain", "example\n"), ("plusdomain", "example.org\n"),
                       ("locals", "test.example\n# comment\n\nlocalhost  \n"),
                       ("rcpthosts", "test.example\n"), ("badmailfrom", b"spam@x\x01y\xe9\n"),
                       ("databytes", "1000000x\n"), ("concurrencyremote", "abc\n"),
                       ("queuelifetime", "\n"), ("unknownthing", "1\n"), ("other", "")):
        h.control(name, text)
    os.mkdir(os.path.join(h.path, "control", "smtproutes"))      # exists, cannot be read as a file
    uids, gids = ids(h)
    code, out = showctl(h)
    assert code == 0
    qmail_part = out[:out.index("\n\n\nNow qmailpy's own files:\n")]
    assert qmail_part == (
        "qmail home directory: %s.\n" % h.path
        + "user-ext delimiter: -.\n"
        "paternalism (in decimal): 2.\n"
        "silent concurrency limit: 120.\n"
        "subdirectory split: 23.\n"
        "user ids: %s.\n" % uids
        + "group ids: %s.\n" % gids
        + "\nbadmailfrom: \nspam@x?y? not accepted in MAIL FROM.\n"
        "\nbouncefrom: (Default.) Bounce user name is MAILER-DAEMON.\n"
        "\nbouncehost: (Default.) Bounce host name is test.example.\n"
        "\nconcurrencylocal: (Default.) Local concurrency is 10.\n"
        "\nconcurrencyremote: (Default.) Remote concurrency is 20.\n"
        "\ndatabytes: SMTP DATA limit is 1000000 bytes.\n"
        "\ndefaultdomain: Default domain name is example.\n"
        "\ndefaulthost: (Default.) Default host name is test.example.\n"
        "\ndoublebouncehost: (Default.) 2B recipient host: test.example.\n"
        "\ndoublebounceto: (Default.) 2B recipient user: postmaster.\n"
        "\nenvnoathost: (Default.) Presumed domain name is test.example.\n"
        "\nhelohost: (Default.) SMTP client HELO host name is test.example.\n"
        "\nidhost: (Default.) Message-ID host name is test.example.\n"
        "\nlocaliphost: (Default.) Local IP address becomes test.example.\n"
        "\nlocals: \nMessages for test.example are delivered locally.\n"
        "Messages for localhost are delivered locally.\n"
        "\nme: My name is test.example.\n"
        "\npercenthack: (Default.) The percent hack is not allowed.\n"
        "\nplusdomain: Plus domain name is example.org.\n"
        "\nqmqpservers: (Default.) No QMQP servers.\n"
        "\nqueuelifetime: (Default.) Message lifetime in the queue is 604800 seconds.\n"
        "\nrcpthosts: \nSMTP clients may send messages to recipients at test.example.\n"
        "\nmorercpthosts: (Default.) No effect.\n"
        "\nmorercpthosts.cdb: (Default.) No effect.\n"
        "\nsmtpgreeting: (Default.) SMTP greeting: 220 test.example.\n"
        "\nsmtproutes: Oops! Trouble reading this file.\n"
        "\ntimeoutconnect: (Default.) SMTP client connection timeout is 60 seconds.\n"
        "\ntimeoutremote: (Default.) SMTP client data timeout is 1200 seconds.\n"
        "\ntimeoutsmtpd: (Default.) SMTP server data timeout is 1200 seconds.\n"
        "\nvirtualdomains: (Default.) No virtual domains.\n")
    own = out[len(qmail_part):]
    assert "\nmaxrcpt: (Default.) Recipients per message are at most 1000 (0: no count).\n" in own
    assert "\nqueuebackend: (Default.) Queue backend is dir.\n" in own
    assert "\nroles: \nRole account: alias:%s\n" % h.user in own
    assert own.endswith("\nother: I have no idea what this file does.\n"
                        "\nunknownthing: I have no idea what this file does.\n")


def test_showctl_morercpthosts_states(qmail_home):
    from qmailpy.util.cdb import build
    h = qmail_home
    plain = os.path.join(h.path, "control", "morercpthosts")
    cdb = plain + ".cdb"

    def state():
        out = showctl(h)[1]
        return out[out.index("\nmorercpthosts: "):out.index("\nsmtpgreeting: ")]
    build(cdb, [])
    assert state().endswith("Oops! morercpthosts.cdb exists but morercpthosts doesn't.\n")
    os.unlink(cdb)
    h.control("morercpthosts", "a.example\n")
    assert state() == ("\nmorercpthosts: \nSMTP clients may send messages to recipients at a.example.\n"
                       "\nmorercpthosts.cdb: Oops! morercpthosts exists but morercpthosts.cdb doesn't.\n")
    build(cdb, [])
    os.utime(plain, (time.time(), time.time() + 10))
    assert state().endswith("Oops! morercpthosts.cdb is older than morercpthosts.\n")
    assert h.run(["qmail-newmrh"]).returncode == 0
    os.utime(plain, (0, 0))
    assert state().endswith("\nmorercpthosts.cdb: Modified recently enough; hopefully up to date.\n")
    os.unlink(os.path.join(h.path, "control", "rcpthosts"))
    assert "\nmorercpthosts: \nNo rcpthosts; doesn't matter that morercpthosts has a.example.\n" in state()


def test_showctl_bad_input(qmail_home):
    h = qmail_home
    done = h.run(["qmail-showctl", "-v"])
    assert (done.returncode, done.stdout, done.stderr) == (100, b"", b"usage: qmail-showctl\n")
    me = os.path.join(h.path, "control", "me")
    os.unlink(me)
    os.mkdir(me)
    code, out = showctl(h)
    assert code == 111 and out.endswith("group ids: %s.\nOops! Trouble reading control/me." % ids(h)[1])
    os.rmdir(me)
    os.rename(os.path.join(h.path, "control"), os.path.join(h.path, "control.away"))
    code, out = showctl(h)
    assert code == 111 and out.endswith(".\nOops! Unable to chdir to control.\n")


def test_newmrh_builds_the_cdb_qmail_smtpd_consults(qmail_home):
    from qmailpy.util.cdb import CDB
    h = qmail_home
    h.control("morercpthosts", "More.Example  \n# hidden.example\n\n\tleading.example\t\nlast.example")
    done = h.run(["qmail-newmrh"])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    path = os.path.join(h.path, "control", "morercpthosts.cdb")
    assert os.stat(path).st_mode & 0o777 == 0o644
    table = CDB.open(path)
    assert [k for k in (b"more.example", b"\tleading.example", b"last.example") if k in table] == [
        b"more.example", b"\tleading.example", b"last.example"]
    assert b"# hidden.example" not in table and b"More.Example" not in table
    s = SmtpdProcess(h)
    try:
        s.reply()
        s.command(b"MAIL FROM:<>\r\n")
        assert s.command(b"RCPT TO:<a@MORE.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<a@last.example>\r\n") == b"250 ok\r\n"
        assert s.command(b"RCPT TO:<a@hidden.example>\r\n") == (
            b"553 sorry, that domain isn't in my list of allowed rcpthosts (#5.7.1)\r\n")
    finally:
        s.close()


def test_newmrh_without_the_list_fails_and_keeps_the_old_cdb(qmail_home):
    h = qmail_home
    h.control("morercpthosts", "kept.example\n")
    assert h.run(["qmail-newmrh"]).returncode == 0
    cdb = os.path.join(h.path, "control", "morercpthosts.cdb")
    before = open(cdb, "rb").read()
    os.unlink(os.path.join(h.path, "control", "morercpthosts"))
    done = h.run(["qmail-newmrh"])
    assert (done.returncode, done.stderr) == (
        111, b"qmail-newmrh: fatal: unable to read control/morercpthosts: file does not exist\n")
    assert open(cdb, "rb").read() == before
    assert h.run(["qmail-newmrh", "extra"]).returncode == 100


def _tables(home):
    lock = os.path.join(home.path, "queue", "lock")
    return os.path.join(lock, "tcpto"), os.path.join(lock, "tcpto6")


def test_tcpto_lists_timeouts_as_qmail_does_and_tcpok_clears_them(qmail_home):
    h = qmail_home
    v4, v6 = _tables(h)
    now = int(time.time())
    table = bytearray(1024)
    for slot, (addr, count, age) in enumerate([("192.0.2.7", 3, 100), ("198.51.100.1", 0, 5),
                                               ("203.0.113.9", 1, 4000)]):
        rec = slot * 16
        table[rec:rec + 4] = ipaddress.ip_address(addr).packed
        table[rec + 4] = count
        struct.pack_into("<I", table, rec + 8, now - age)
    with open(v4, "r+b") as f:
        f.write(table)
    table6 = bytearray(2048)
    table6[32:48] = ipaddress.ip_address("2001:db8::5").packed
    table6[48] = 2
    struct.pack_into("<I", table6, 56, now - 7)
    with open(v6, "r+b") as f:
        f.write(table6)
    done = h.run(["qmail-tcpto"])
    assert done.returncode == 0 and done.stderr == b""
    lines = done.stdout.decode().splitlines(keepends=True)
    pattern = [("192.0.2.7", 100, 3), ("203.0.113.9", 4000, 1), ("2001:db8::5", 7, 2)]
    assert len(lines) == 3
    for line, (addr, age, count) in zip(lines, pattern):
        m = re.fullmatch(r"(\S+) timed out (\d+) seconds ago; # recent timeouts: (\d+)\n", line)
        assert m and m.group(1) == addr and int(m.group(3)) == count, line
        assert age <= int(m.group(2)) <= age + 5
    done = h.run(["qmail-tcpok"])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert open(v4, "rb").read() == bytes(1024) and open(v6, "rb").read() == bytes(2048)
    assert h.run(["qmail-tcpto"]).stdout == b""


def test_tcpto_and_tcpok_report_a_missing_table(qmail_home):
    h = qmail_home
    v4, v6 = _tables(h)
    os.unlink(v6)                     # a home made by qmail: no IPv6 table, not an error
    assert h.run(["qmail-tcpok"]).returncode == 0
    assert h.run(["qmail-tcpto"]).returncode == 0
    os.unlink(v4)
    done = h.run(["qmail-tcpto"])
    assert (done.returncode, done.stdout) == (111, b"fatal: unable to open tcpto: file does not exist\n")
    done = h.run(["qmail-tcpok"])
    assert (done.returncode, done.stderr) == (
        111, b"qmail-tcpok: fatal: unable to write %s: file does not exist\n" % v4.encode())


def _maildir(base):
    md = os.path.join(base, "Maildir")
    for sub in ("tmp", "new", "cur"):
        os.makedirs(os.path.join(md, sub))
    return md


def _message(md, name, data, mtime):
    path = os.path.join(md, name)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, (mtime, mtime))
    return path


def test_maildir2mbox_appends_qmails_bytes_and_empties_the_maildir(qmail_home, tmp_path):
    h = qmail_home
    md = _maildir(str(tmp_path))
    _message(md, "new/1000000000.1.host", b"Return-Path: <a b\t@x>\nSubject: 1\n\nFrom me\n>From you\nlast",
             1000000000)
    _message(md, "cur/1000000100.2.host:2,S", b"Return-Path: <>\n\nhi\n", 1000000100)
    _message(md, "new/1000000200.3.host", b"no return path\n", 1000000200)
    _message(md, "new/.hidden", b"x\n", 1000000300)
    _message(md, "new/now", b"arriving\n", time.time() + 5)        # not older than this second
    stale = _message(md, "tmp/stale", b"", 0)
    mbox = os.path.join(str(tmp_path), "mbox")
    with open(mbox, "wb") as f:
        f.write(b"From old Thu Jan 01 00:00:00 1970\nold\n\n")
    done = h.run(["maildir2mbox"], env=dict(h.env, MAILDIR=md, MAIL=mbox, MAILTMP=mbox + ".tmp"))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert open(mbox, "rb").read() == (
        b"From old Thu Jan 01 00:00:00 1970\nold\n\n"
        b"From a-b-@x Sun Sep 09 01:46:40 2001\nReturn-Path: <a b\t@x>\nSubject: 1\n\n"
        b">From me\n>>From you\nlast\n\n"
        b"From MAILER-DAEMON Sun Sep 09 01:48:20 2001\nReturn-Path: <>\n\nhi\n\n"
        b"From XXX Sun Sep 09 01:50:00 2001\nno return path\n\n")
    assert sorted(os.listdir(os.path.join(md, "new"))) == [".hidden", "now"]
    assert os.listdir(os.path.join(md, "cur")) == []
    assert not os.path.exists(stale) and not os.path.exists(mbox + ".tmp")


def test_maildir2mbox_bad_input_loses_nothing(qmail_home, tmp_path):
    h = qmail_home
    md = _maildir(str(tmp_path))
    mbox = os.path.join(str(tmp_path), "mbox")
    env = dict(h.env, MAILDIR=md, MAIL=mbox, MAILTMP=mbox + ".tmp")
    done = h.run(["maildir2mbox"], env=env)           # nothing new: the mbox is not even created
    assert done.returncode == 0 and not os.path.exists(mbox)
    msg = _message(md, "new/1.x", b"Subject: x\n\nbody\n", 1)
    with open(mbox, "wb") as f:
        f.write(b"untouched\n")
    for missing in ("MAIL", "MAILTMP", "MAILDIR"):
        e = dict(env)
        del e[missing]
        done = h.run(["maildir2mbox"], env=e)
        assert (done.returncode, done.stderr) == (111, b"maildir2mbox: fatal: %s not set\n" % missing.encode())
    done = h.run(["maildir2mbox"], env=dict(env, MAILTMP=os.path.join(str(tmp_path), "no", "dir")))
    assert (done.returncode, done.stderr) == (
        111, b"maildir2mbox: fatal: unable to create %s/no/dir: file does not exist\n" % str(tmp_path).encode())
    done = h.run(["maildir2mbox"], env=dict(env, MAILDIR=md + "-missing"))
    assert done.returncode == 111 and done.stderr.startswith(b"maildir2mbox: fatal: unable to chdir to ")
    assert open(mbox, "rb").read() == b"untouched\n" and os.path.exists(msg)


def test_maildir2mbox_takes_a_fifo_as_an_empty_message(qmail_home, tmp_path):
    h = qmail_home
    md = _maildir(str(tmp_path))
    fifo = os.path.join(md, "new", "1000000000.1.host")
    os.mkfifo(fifo)
    os.utime(fifo, (1000000000, 1000000000))
    mbox = os.path.join(str(tmp_path), "mbox")
    done = h.run(["maildir2mbox"], env=dict(h.env, MAILDIR=md, MAIL=mbox, MAILTMP=mbox + ".tmp"),
                 timeout=20)                    # blocked in open() for good before
    assert (done.returncode, done.stderr) == (0, b"")
    assert open(mbox, "rb").read() == b"From XXX Sun Sep 09 01:46:40 2001\n\n"
    assert not os.path.exists(fifo)


def test_showctl_knows_every_control_file_the_docs_name():
    """No control file of docs/control-files.md gets "I have no idea what this file does."."""
    from qmailpy.cli.qmail_showctl import QMAIL_FILES, RCPTHOSTS_NAMES, qmailpy_files
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "control-files.md")) as f:
        text = f.read()
    table = text[text.index("## Control files"):text.index("## Pitfalls and limits")]
    documented = set()
    for row in re.findall(r"^\| (`[^|]*`) \|", table, re.M):
        documented.update(re.findall(r"`([^`]+)`", row))
    known = set(RCPTHOSTS_NAMES) | {e[1] for e in QMAIL_FILES + qmailpy_files() if len(e) > 1}
    assert documented - known == set()


def test_tools_refuse_symlinks_where_another_account_could_plant_them(qmail_home, tmp_path):
    """Root runs these in directories the home's other accounts own (a single-user home's
    control/ and queue/lock/ are its user's): a planted symlink is refused, its target untouched."""
    h = qmail_home
    secret = tmp_path / "secret"
    secret.write_bytes(b"\xc0\x00\x02\x07\x05" + b"s" * 1019)       # would read as 192.0.2.7, 5 timeouts
    control = os.path.join(h.path, "control")
    os.symlink(secret, os.path.join(control, "morercpthosts"))
    done = h.run(["qmail-newmrh"])
    assert done.returncode == 111 and b"a symbolic link: refused" in done.stderr
    os.unlink(os.path.join(control, "morercpthosts"))
    h.control("morercpthosts", "a.example\n")
    os.symlink(secret, os.path.join(control, "morercpthosts.cdb.tmp"))   # a planted temporary name
    assert h.run(["qmail-newmrh"]).returncode == 0
    assert not os.path.islink(os.path.join(control, "morercpthosts.cdb"))
    v4 = _tables(h)[0]
    os.unlink(v4)
    os.symlink(secret, v4)
    done = h.run(["qmail-tcpto"])
    assert done.returncode == 111 and b"a symbolic link: refused" in done.stdout and b"192.0.2.7" not in done.stdout
    done = h.run(["qmail-tcpok"])
    assert done.returncode == 111 and b"a symbolic link: refused" in done.stderr
    assert secret.read_bytes()[:5] == b"\xc0\x00\x02\x07\x05"
