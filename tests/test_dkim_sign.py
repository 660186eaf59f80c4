"""DKIM signing in qmail-remote (docs/delivery.md "DKIM signing"): a real delivery to an
aiosmtpd peer, the received message verified by dkimpy and by Perl's Mail::DKIM, the public
keys served by dnsmasq (dns_harness.py) as TXT records; keys made by `qmailctl dkim keygen`
and by OpenDKIM's opendkim-genkey; a key that cannot be used defers, nothing is sent.
"""
import os
import re
import shutil
import subprocess

import pytest

from conftest import AS_ROOT
from dns_harness import Dnsmasq, txt_strings
from remote_harness import Smtpd, qmail_remote, route

pytestmark = pytest.mark.slow

MESSAGE = (b"From: Joe Example <joe@example.test>\nTo: ann@x.test\nSubject: signed\n"
           b"Date: 27 Nov 2026 03:00:00 -0000\nMessage-ID: <1@example.test>\n\n"
           b".leading dot\nbare\rCR and a CRLF\r\n  spaces  \t \n\n\n")

MAIL_DKIM = r'''
use strict;
use Mail::DKIM::Verifier;
use Net::DNS::Resolver;
Mail::DKIM::DNS::resolver(Net::DNS::Resolver->new(nameservers => ["127.0.0.1"], port => $ARGV[0]));
my $v = Mail::DKIM::Verifier->new();
binmode STDIN;
while (<STDIN>) { s/\r?\n\z/\r\n/; $v->PRINT($_); }
$v->CLOSE;
foreach my $s ($v->signatures) { print $s->algorithm, " ", $s->domain, " ", $s->result, "\n"; }
'''


def keygen(home, *args):
    done = home.run(["qmailctl", "dkim", "keygen", *args])
    assert done.returncode == 0, done.stderr
    return txt_value(done.stdout.decode())


def txt_value(zone_text):
    """The TXT value of a zone-file record (its quoted strings joined)."""
    return "".join(re.findall(r'"([^"]*)"', zone_text))


def dnsmasq_for(records):
    return Dnsmasq(["txt-record=%s,%s" % (name, txt_strings(value)) for name, value in records])


def deliver(home, message=MESSAGE, stdin_file=None):
    with Smtpd() as peer:
        route(home, "x.test", peer.port)
        if stdin_file is None:
            _, records = qmail_remote(home, "x.test", b"joe@example.test", b"ann@x.test",
                                      message=message)
        else:
            with open(stdin_file, "wb") as f:
                f.write(message)
            with open(stdin_file, "rb") as f:
                done = home.run(["qmail-remote", "x.test", "joe@example.test", "ann@x.test"],
                                stdin=f, input=None)
            records = done.stdout[:-1].split(b"\0")
    return records, peer.transactions


def dkimpy_results(data, server):
    import dkim
    import dns.message
    import dns.query

    def dnsfunc(name, timeout=5):
        query = dns.message.make_query(name.decode() if isinstance(name, bytes) else name, "TXT")
        answer = dns.query.udp(query, "127.0.0.1", port=server.port, timeout=timeout)
        for rrset in answer.answer:
            for rd in rrset:
                return b"".join(rd.strings)
        return None

    d = dkim.DKIM(data)
    count = sum(1 for name, _ in d.headers if name.lower() == b"dkim-signature")
    return [d.verify(idx=i, dnsfunc=dnsfunc) for i in range(count)]


def mail_dkim_results(data, server):
    if subprocess.run(["perl", "-MMail::DKIM::Verifier", "-e1"], capture_output=True).returncode:
        pytest.skip("Perl's Mail::DKIM is not installed (bin/test installs libmail-dkim-perl)")
    done = subprocess.run(["perl", "-e", MAIL_DKIM, str(server.port)], input=data,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().split("\n")[:-1]


OPENDKIM_VERDICT = re.compile(r"verification \(s=(\S+?),? d=(\S+?),.*\) (succeeded|failed)")


def opendkim_results(data, server, tmp_path):
    """[(selector, domain, 'succeeded' or 'failed')] of OpenDKIM's own verifier (`opendkim -t`,
    its test mode) on data, which reaches dnsmasq through Unbound's stub zone for .test."""
    binary = shutil.which("opendkim") or shutil.which("opendkim", path="/usr/sbin")
    if binary is None:
        pytest.skip("opendkim is not installed (bin/test installs it)")
    unbound, conf, message = (str(tmp_path / n) for n in ("unbound.conf", "opendkim.conf", "msg"))
    with open(unbound, "w") as f:
        f.write('server:\n  do-not-query-localhost: no\n  module-config: "iterator"\n'
                '  local-zone: "test." nodefault\nstub-zone:\n  name: "test"\n'
                '  stub-addr: 127.0.0.1@%d\n' % server.port)
    with open(conf, "w") as f:
        f.write("Mode v\nSyslog no\nResolverConfiguration %s\n" % unbound)
    with open(message, "wb") as f:
        f.write(data.replace(b"\r\n", b"\n"))
    done = subprocess.run([binary, "-x", conf, "-t", message], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = OPENDKIM_VERDICT.findall((done.stdout + done.stderr).decode())
    assert found, (done.stdout, done.stderr)
    return found


def without_signature(data, algorithm):
    """data without its DKIM-Signature field of that a= value."""
    head, _, body = data.partition(b"\r\n\r\n")
    fields = re.split(rb"\r\n(?=[^ \t])", head)
    kept = [f for f in fields if not (f.lower().startswith(b"dkim-signature:")
                                      and re.search(rb"a=" + algorithm + rb";", f))]
    return b"\r\n".join(kept) + b"\r\n\r\n" + body


def signature_tags(data):
    header = data.split(b"\r\n\r\n", 1)[0]
    fields = re.findall(rb"^DKIM-Signature:(.*?)(?=\r\n[^ \t])", header, re.M | re.S)
    return [dict((k.strip(), re.sub(rb"\s", b"", v)) for k, _, v in
                 (t.partition(b"=") for t in f.split(b";") if t.strip())) for f in fields]


def test_rsa_and_ed25519_signatures_verify(qmail_home, tmp_path):
    rsa = keygen(qmail_home, "example.test", "rsa1")
    ed = keygen(qmail_home, "example.test", "ed1", "--ed25519")
    assert rsa.startswith("v=DKIM1; k=rsa; p=") and ed.startswith("v=DKIM1; k=ed25519; p=")
    with dnsmasq_for([("rsa1._domainkey.example.test", rsa),
                      ("ed1._domainkey.example.test", ed)]) as server:
        records, transactions = deliver(qmail_home)
        assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
        [t] = transactions
        tags = signature_tags(t.data)
        assert sorted(x[b"a"] for x in tags) == [b"ed25519-sha256", b"rsa-sha256"]
        for x in tags:
            assert (x[b"d"], x[b"c"]) == (b"example.test", b"relaxed/relaxed")
            signed = x[b"h"].lower().split(b":")
            assert signed.count(b"from") == 2           # From over-signed
            assert {b"to", b"subject", b"date", b"message-id"} <= set(signed)
        assert dkimpy_results(t.data, server) == [True, True]
        # Mail::DKIM as Debian 12 has it knows no Ed25519 (RFC 8463): it checks the RSA one,
        # OpenDKIM each of them alone
        results = mail_dkim_results(t.data, server)
        assert "rsa-sha256 example.test pass" in results, results
        for algorithm, selector in ((b"rsa-sha256", "ed1"), (b"ed25519-sha256", "rsa1")):
            alone = without_signature(t.data, algorithm)
            assert opendkim_results(alone, server, tmp_path) == [(selector, "example.test",
                                                                  "succeeded")]
        tampered = without_signature(t.data, b"rsa-sha256").replace(b"spaces", b"spices")
        assert opendkim_results(tampered, server, tmp_path) == [("ed1", "example.test", "failed")]


def test_subdomain_line_and_message_from_a_file(qmail_home, tmp_path):
    """A `.example.test` line signs mail from a subdomain as d=example.test (relaxed DMARC
    alignment); qmail-rspawn hands qmail-remote the queue's file, which can seek."""
    rsa = keygen(qmail_home, ".example.test", "sub")
    message = MESSAGE.replace(b"joe@example.test", b"joe@news.mail.example.test")
    with dnsmasq_for([("sub._domainkey.example.test", rsa)]) as server:
        records, [t] = deliver(qmail_home, message, stdin_file=str(tmp_path / "mess"))
        assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
        [tags] = signature_tags(t.data)
        assert (tags[b"d"], tags[b"s"]) == (b"example.test", b"sub")
        assert dkimpy_results(t.data, server) == [True]
        assert mail_dkim_results(t.data, server) == ["rsa-sha256 example.test pass"]


def test_opendkim_genkey_key_as_it_is(qmail_home):
    genkey = shutil.which("opendkim-genkey") or shutil.which("opendkim-genkey", path="/usr/sbin")
    if genkey is None:
        pytest.skip("opendkim-genkey is not installed (bin/test installs opendkim-tools)")
    keydir = os.path.join(qmail_home.path, "control", "opendkim")
    os.mkdir(keydir)
    subprocess.run([genkey, "-b", "2048", "-d", "example.test", "-s", "og", "-D", keydir],
                   check=True, capture_output=True)
    with open(os.path.join(keydir, "og.txt")) as f:
        value = txt_value(f.read())
    if AS_ROOT:     # the key belongs to the account that signs
        os.chown(os.path.join(keydir, "og.private"), qmail_home.uid, qmail_home.gid)
    qmail_home.control("dkimkeys", "example.test:og:control/opendkim/og.private\n")
    with dnsmasq_for([("og._domainkey.example.test", value)]) as server:
        records, [t] = deliver(qmail_home)
        assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
        assert dkimpy_results(t.data, server) == [True]
        assert mail_dkim_results(t.data, server) == ["rsa-sha256 example.test pass"]


@pytest.mark.parametrize("problem, reason", [
    ("missing", b"No such file or directory"),
    ("mode 644", b"other accounts may read or write it (mode 644): make it mode 600, owned by "
                 b"the account of qmailr"),
    ("garbage", b"it is not a PEM RSA or Ed25519 private key"),
])
def test_unusable_key_defers_and_sends_nothing(qmail_home, problem, reason):
    keygen(qmail_home, "example.test", "rsa1")
    path = os.path.join(qmail_home.path, "control", "dkim", "example.test.rsa1.private")
    if problem == "missing":
        os.unlink(path)
    elif problem == "mode 644":
        os.chmod(path, 0o644)
    else:
        with open(path, "wb") as f:
            f.write(b"not a key\n")
    records, transactions = deliver(qmail_home)
    assert records == [b"ZUnable to use DKIM key control/dkim/example.test.rsa1.private for "
                       b"example.test: " + reason + b". (#4.3.0)\n"]
    assert transactions == []


@pytest.mark.skipif(AS_ROOT, reason="root reads any file")
def test_unreadable_key_defers(qmail_home):
    keygen(qmail_home, "example.test", "rsa1")
    os.chmod(os.path.join(qmail_home.path, "control", "dkim", "example.test.rsa1.private"), 0)
    records, transactions = deliver(qmail_home)
    assert records == [b"ZUnable to use DKIM key control/dkim/example.test.rsa1.private for "
                       b"example.test: Permission denied. (#4.3.0)\n"]
    assert transactions == []


def test_other_domains_go_unsigned_and_bad_header_bounces(qmail_home):
    keygen(qmail_home, "example.test", "rsa1")
    other = MESSAGE.replace(b"joe@example.test", b"joe@other.test")
    records, [t] = deliver(qmail_home, other)
    assert records[-1].startswith(b"K127.0.0.1 accepted message.")
    assert b"DKIM-Signature" not in t.data
    records, transactions = deliver(qmail_home, b"Subject: x\nnot a field\n" + MESSAGE)
    assert records[0].startswith(b"DSorry, the message header cannot be DKIM-signed: ")
    assert records[0].endswith(b"(#5.6.0)\n") and transactions == []


def test_bad_dkimkeys_line_is_control_error(qmail_home):
    qmail_home.control("dkimkeys", "example.test:control/dkim/key\n")
    records, _ = deliver(qmail_home)
    assert records == [b"ZUnable to read control files. (#4.3.0)\n"]


def test_keygen_files_and_refusals(qmail_home):
    keygen(qmail_home, "Example.TEST", "s1")
    key = os.stat(os.path.join(qmail_home.path, "control", "dkim", "example.test.s1.private"))
    assert key.st_mode & 0o777 == 0o600 and key.st_uid == qmail_home.uid
    with open(os.path.join(qmail_home.path, "control", "dkimkeys")) as f:
        assert f.read() == "example.test:s1:control/dkim/example.test.s1.private\n"
    again = qmail_home.run(["qmailctl", "dkim", "keygen", "example.test", "s1"])
    assert again.returncode == 100 and b"already has a key" in again.stderr
    bad = qmail_home.run(["qmailctl", "dkim", "keygen", "exa mple.test", "s2"])
    assert bad.returncode == 100 and b"is not a domain name" in bad.stderr


def test_sendmail_mail_and_bounces_signed_end_to_end(qmail_home):
    """Through qmail-send, qmail-rspawn's workers and qmail-remote: mail from sendmail and
    the bounce of a message from a remote sender both leave signed."""
    from send_harness import Daemons
    rsa = keygen(qmail_home, "example.test", "rsa1")
    ed = keygen(qmail_home, "test.example", "ed1", "--ed25519")       # control/me: the bounces
    with dnsmasq_for([("rsa1._domainkey.example.test", rsa),
                      ("ed1._domainkey.test.example", ed)]) as server, Smtpd() as peer:
        qmail_home.control("smtproutes", "x.test:127.0.0.1:%d\n" % peer.port)
        daemons = Daemons(qmail_home)
        try:
            daemons.start()
            daemons.wait_line(r"^status: ")
            done = qmail_home.run(["sendmail", "-f", "joe@example.test", "ann@x.test"], input=MESSAGE)
            assert done.returncode == 0, done.stderr
            done = qmail_home.queue_message(b"From: ann@x.test\nSubject: to nobody\n\nhi\n",
                                            b"ann@x.test", [b"nosuchuser@test.example"])
            assert done.returncode == 0, done.stderr
            daemons.wait_line(r"^delivery \d+: success: 127.0.0.1_accepted_message", 2)
        finally:
            daemons.kill()
        assert sorted(t.mail_from for t in peer.transactions) == ["<>", "joe@example.test"]
        for t in peer.transactions:
            [tags] = signature_tags(t.data)
            assert tags[b"d"] == (b"test.example" if t.mail_from == "<>" else b"example.test")
            assert dkimpy_results(t.data, server) == [True]


def test_dkimpy_imported_only_to_sign(qmail_home):
    """qmail-remote stays fast to start: dkimpy and PyNaCl are imported only when a key signs."""
    import sys
    keygen(qmail_home, "example.test", "rsa1")

    def imported(message):
        with Smtpd() as peer:
            route(qmail_home, "x.test", peer.port)
            done = qmail_home.run([sys.executable, "-X", "importtime", "-m", "qmailpy.cli.qmail_remote",
                                   "x.test", "joe@example.test", "ann@x.test"], input=message)
        assert done.stdout.split(b"\0")[-2].startswith(b"K127.0.0.1 accepted message."), done.stdout
        return {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}

    unsigned = imported(MESSAGE.replace(b"joe@example.test", b"joe@other.test"))
    assert not {"dkim", "nacl.signing"} & unsigned
    assert "dkim" in imported(MESSAGE)


@pytest.mark.parametrize("from_file", [False, True], ids=["pipe", "file"])
def test_from_after_64k_of_header_still_signed(qmail_home, tmp_path, from_file):
    """qmail-remote looks at the first 64 kB for SMTPUTF8; a From: past them is still found."""
    rsa = keygen(qmail_home, "example.test", "rsa1")
    filler = b"".join(b"X-Filler-%d: %s\n" % (i, b"x" * 60) for i in range(1200))
    message = b"To: ann@x.test\n" + filler + MESSAGE.replace(b"To: ann@x.test\n", b"")
    with dnsmasq_for([("rsa1._domainkey.example.test", rsa)]) as server:
        records, [t] = deliver(qmail_home, message,
                               stdin_file=str(tmp_path / "mess") if from_file else None)
        assert records[-1].startswith(b"K127.0.0.1 accepted message."), records
        assert t.data.startswith(b"DKIM-Signature:")
        assert t.data.endswith(message.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                               .replace(b"\n", b"\r\n"))
        assert dkimpy_results(t.data, server) == [True]


def test_keygen_never_appends_to_a_linked_dkimkeys(qmail_home):
    """control/ may belong to the home's single user while root runs qmailctl: a dkimkeys
    that is a hard link to some other file is refused, that file left as it was."""
    victim = qmail_home.control("victim", "a.test:s:k\n")        # parses as dkimkeys
    before = b"a.test:s:k\n"
    os.link(victim, os.path.join(qmail_home.path, "control", "dkimkeys"))
    done = qmail_home.run(["qmailctl", "dkim", "keygen", "example.test", "s1", "--ed25519"])
    assert done.returncode == 111 and b"control/dkimkeys is not a plain file" in done.stderr
    with open(victim, "rb") as f:
        assert f.read() == before


@pytest.mark.parametrize("form", ["rsa pkcs1", "rsa pkcs8", "ed25519 pkcs8", "ed25519 dknewkey"])
def test_key_file_forms(tmp_path, form):
    """Every key form dkimkeys names signs verifiably: PKCS#1 (older opendkim-genkey),
    PKCS#8 (openssl 3, qmailctl dkim keygen) and dkimpy's own base64 Ed25519 seed."""
    import base64

    import dkim

    from qmailpy import dkimkeys
    from qmailpy.ctl import dkim as keygen_module
    from qmailpy.remote import dkimsign
    if form.startswith("rsa"):
        private, public = keygen_module.rsa_key()
        if form == "rsa pkcs1":
            private = subprocess.run(["openssl", "rsa", "-traditional"], input=private,
                                     capture_output=True, check=True).stdout
            assert private.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
        record = b"v=DKIM1; k=rsa; p=" + base64.b64encode(public)
    else:
        private, public = keygen_module.ed25519_key()
        if form == "ed25519 dknewkey":
            private = base64.b64encode(base64.b64decode(b"".join(private.split(b"\n")[1:-2]))[-32:])
        record = b"v=DKIM1; k=ed25519; p=" + base64.b64encode(public)
    path = tmp_path / "key"
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, private)
    os.close(fd)
    entry = dkimkeys.Entry(b"example.test", b"s", os.fsencode(str(path)))
    wire = MESSAGE.replace(b"\r\n", b"\n").replace(b"\r", b"\n")      # as smtp.py sends it
    signed = dkimsign.sign(MESSAGE, [entry]) + wire
    assert dkim.verify(signed, dnsfunc=lambda name, timeout=5: record)
    assert not dkim.verify(signed.replace(b"signed", b"changed"), dnsfunc=lambda name, timeout=5: record)
