"""control/dkimkeys and the DKIM private keys it names (docs/delivery.md "DKIM signing").

One line per signing key, `domain:selector:keyfile`: `example.com` signs mail whose
From: address is in example.com, `.example.com` mail from any subdomain of it (as
in rcpthosts), with d=example.com, which DMARC's relaxed alignment accepts. Lines
for the exact From domain win over `.` lines, and a longer `.` suffix over a
shorter one; every line of the winning domain signs (an RSA and an Ed25519 key:
two signatures, RFC 8463). A relative keyfile is relative to the qmail home.

Key files: PEM RSA keys as opendkim-genkey and openssl write them (PKCS#1 `RSA
PRIVATE KEY` or PKCS#8 `PRIVATE KEY`), PKCS#8 PEM Ed25519 keys (`openssl genpkey
-algorithm ed25519`, `qmailctl dkim keygen --ed25519`) and dkimpy's dknewkey
Ed25519 keys (the base64 of the 32-byte seed). As opendkim does by default, a key
file that accounts other than its owner may read or write is refused.
"""
import base64
import binascii
import os

CONTROL = "dkimkeys"
RSA = b"rsa-sha256"
ED25519 = b"ed25519-sha256"
# DER of a PKCS#8 Ed25519 private key (RFC 8410) up to its 32-byte seed.
ED25519_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
_LABEL = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_")


class KeyProblem(Exception):
    """A key file that cannot be used; str() is the report's reason."""


class Entry:
    """One dkimkeys line: pattern (lowercase, leading '.' for subdomains), selector, keyfile."""
    __slots__ = ("pattern", "selector", "keyfile")

    def __init__(self, pattern, selector, keyfile):
        self.pattern, self.selector, self.keyfile = pattern, selector, keyfile

    @property
    def domain(self):
        """The d= of its signatures."""
        return self.pattern.lstrip(b".")


def _name_ok(name):
    return bool(name) and all(label and set(label) <= _LABEL for label in name.split(b"."))


def entries(lines):
    """[Entry] from control/dkimkeys lines; raises ControlError on a bad line."""
    from qmailpy.home import ControlError
    found = []
    for line in lines:
        fields = line.strip().split(b":", 2)
        if len(fields) != 3:
            raise ControlError("control/%s: %r is not domain:selector:keyfile" % (CONTROL, line))
        pattern, selector, keyfile = fields[0].lower(), fields[1].lower(), fields[2]
        if not _name_ok(pattern[1:] if pattern.startswith(b".") else pattern):
            raise ControlError("control/%s: %r: bad domain" % (CONTROL, line))
        if not _name_ok(selector):
            raise ControlError("control/%s: %r: bad selector" % (CONTROL, line))
        if not keyfile:
            raise ControlError("control/%s: %r: no key file" % (CONTROL, line))
        found.append(Entry(pattern, selector, keyfile))
    return found


def for_domain(table, domain):
    """The entries that sign mail from domain (bytes): the exact ones, else those of
    the longest matching `.` suffix; [] when none."""
    domain = domain.lower().rstrip(b".")
    exact = [e for e in table if e.pattern == domain]
    if exact:
        return exact
    best = max((len(e.pattern) for e in table
                if e.pattern.startswith(b".") and domain.endswith(e.pattern)), default=0)
    return [e for e in table if best and len(e.pattern) == best and domain.endswith(e.pattern)]


def parse_key(data):
    """(algorithm, key in the form dkimpy's sign() takes) of a key file's bytes;
    raises KeyProblem."""
    text = data.strip()
    if b"-----BEGIN RSA PRIVATE KEY-----" in text:
        return RSA, text
    if b"-----BEGIN PRIVATE KEY-----" in text:
        inner = text.split(b"-----BEGIN PRIVATE KEY-----", 1)[1].split(b"-----END", 1)[0]
        try:
            der = base64.b64decode(b"".join(inner.split()), validate=True)
        except binascii.Error:
            raise KeyProblem("its PEM is not base64") from None
        if der.startswith(ED25519_PKCS8_PREFIX) and len(der) == len(ED25519_PKCS8_PREFIX) + 32:
            return ED25519, base64.b64encode(der[len(ED25519_PKCS8_PREFIX):])
        return RSA, text
    try:
        seed = base64.b64decode(text, validate=True)
    except binascii.Error:
        seed = b""
    if len(seed) == 32:
        return ED25519, text
    raise KeyProblem("it is not a PEM RSA or Ed25519 private key")


def load(path):
    """parse_key() of the key file at path, refused when other accounts may read or write
    it; raises KeyProblem."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise KeyProblem(e.strerror) from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o077:
            raise KeyProblem("other accounts may read or write it (mode %o): make it mode 600, "
                             "owned by the account of qmailr" % (mode & 0o777))
        data = b""
        while len(data) < 65536:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise KeyProblem(e.strerror) from None
    finally:
        os.close(fd)
    return parse_key(data)


def ed25519_pkcs8_pem(seed):
    """The PKCS#8 PEM of an Ed25519 key's 32-byte seed (what openssl genpkey writes)."""
    b64 = base64.b64encode(ED25519_PKCS8_PREFIX + seed)
    return b"-----BEGIN PRIVATE KEY-----\n" + b64 + b"\n-----END PRIVATE KEY-----\n"
