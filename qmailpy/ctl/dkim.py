"""qmailctl dkim keygen DOMAIN SELECTOR [--ed25519]: a new DKIM signing key (docs/delivery.md "DKIM signing").

Writes control/dkim/DOMAIN.SELECTOR.private (mode 600, owned by the account of
qmailr, which signs), adds `DOMAIN:SELECTOR:control/dkim/DOMAIN.SELECTOR.private`
to control/dkimkeys, and prints the TXT record to publish at
SELECTOR._domainkey.DOMAIN. RSA keys are 2048 bits, made by openssl; Ed25519 keys
(RFC 8463) by PyNaCl, written as PKCS#8 PEM. DOMAIN may start with '.' (every
subdomain; the record goes under the domain itself). Exits 0, 100 on a usage
error (a bad name, a key or line that exists), 111 when something failed.
"""
import argparse
import base64
import os
import subprocess
import sys

from qmailpy import dkimkeys
from qmailpy.home import ControlError, control_list, qmail_home

HELP = "make DKIM signing keys (qmailctl dkim keygen DOMAIN SELECTOR [--ed25519])"
KEY_DIR = "dkim"
RSA_BITS = 2048
TXT_STRING_MAX = 255


class Usage(Exception):
    pass


def add_arguments(parser, name):
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    keygen = sub.add_parser("keygen", help="write a new key, list it in control/dkimkeys, "
                                           "print its DNS record")
    keygen.add_argument("--home", default=argparse.SUPPRESS,
                        help="the qmail home (default $QMAILHOME or /var/qmail)")
    keygen.add_argument("domain")
    keygen.add_argument("selector")
    keygen.add_argument("--ed25519", action="store_true",
                        help="an Ed25519 key (RFC 8463) instead of RSA-2048")


def rsa_key():
    """(PKCS#8 PEM private key, DER public key) of a new RSA key, by openssl."""
    try:
        private = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                                  "rsa_keygen_bits:%d" % RSA_BITS], capture_output=True,
                                 check=True).stdout
        public = subprocess.run(["openssl", "pkey", "-pubout", "-outform", "DER"], input=private,
                                capture_output=True, check=True).stdout
    except FileNotFoundError:
        raise OSError("openssl is not installed: it makes RSA keys") from None
    except subprocess.CalledProcessError as e:
        raise OSError("openssl failed: %s" % e.stderr.decode("utf-8", "replace").strip()) from None
    return private, public


def ed25519_key():
    """(PKCS#8 PEM private key, raw 32-byte public key) of a new Ed25519 key."""
    import nacl.signing
    key = nacl.signing.SigningKey.generate()
    return dkimkeys.ed25519_pkcs8_pem(bytes(key)), bytes(key.verify_key)


def txt_record(selector, domain, ktype, public):
    """The zone-file line of the key's TXT record, split in strings of at most 255 bytes."""
    value = "v=DKIM1; k=%s; p=%s" % (ktype, base64.b64encode(public).decode("ascii"))
    strings = [value[i:i + TXT_STRING_MAX] for i in range(0, len(value), TXT_STRING_MAX)]
    return "%s._domainkey.%s. IN TXT ( %s )" % (selector, domain,
                                                  " ".join('"%s"' % s for s in strings))


def _key_dir(home):
    """A descriptor of control/dkim, made if missing; refused when others may write it."""
    control = os.path.join(home, "control")
    try:
        os.mkdir(os.path.join(control, KEY_DIR), 0o755)
    except FileExistsError:
        pass
    fd = os.open(os.path.join(control, KEY_DIR), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    st = os.fstat(fd)
    if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
        os.close(fd)
        raise OSError("control/%s is writable by other accounts or owned by another account"
                      % KEY_DIR)
    return fd


def _signer_ids(home):
    """(uid, gid) the key file gets as root: the account of qmailr; None when not root."""
    if os.geteuid() != 0:
        return None
    from qmailpy.privs import account
    acct = account(home, "qmailr")
    return acct.uid, acct.gid


def keygen(home, domain, selector, ed25519):
    """Write the key and the dkimkeys line; returns the TXT record. Raises Usage, OSError,
    ControlError."""
    pattern, selector = domain.lower().encode("ascii", "replace"), selector.lower().encode(
        "ascii", "replace")
    line = b"%s:%s:control/%s/%s.%s.private" % (pattern, selector, KEY_DIR.encode(),
                                                 pattern.lstrip(b"."), selector)
    try:
        [entry] = dkimkeys.entries([line])
    except ControlError as e:
        raise Usage("%r is not a domain name or %r not a selector" % (domain, selector.decode())) from None
    listed = dkimkeys.entries(control_list(home, dkimkeys.CONTROL, []))
    if any(e.pattern == entry.pattern and e.selector == entry.selector for e in listed):
        raise Usage("control/dkimkeys already has a key for %s with selector %s"
                    % (domain, selector.decode()))
    ids = _signer_ids(home)
    private, public = ed25519_key() if ed25519 else rsa_key()
    name = os.path.basename(os.fsdecode(entry.keyfile))
    dirfd = _key_dir(home)
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=dirfd)
        except FileExistsError:
            raise Usage("control/%s/%s exists: remove it or choose another selector"
                        % (KEY_DIR, name)) from None
        try:
            if ids is not None:
                os.fchown(fd, *ids)
            os.fchmod(fd, 0o600)
            os.write(fd, private)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    _append_line(home, line)
    return txt_record(selector.decode(), entry.domain.decode(), "ed25519" if ed25519 else "rsa",
                      public)


def _append_line(home, line):
    """Append line to control/dkimkeys: by descriptors, refusing a link or another account's
    file (control/ may belong to the single user of a home while root runs this)."""
    import stat
    control = os.open(os.path.join(home, "control"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(dkimkeys.CONTROL, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644,
                     dir_fd=control)
        owners = (0, os.geteuid(), os.fstat(control).st_uid)
    finally:
        os.close(control)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in owners:
            raise OSError("control/%s is not a plain file of this home's accounts: not changed"
                          % dkimkeys.CONTROL)
        end = b""
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            end = b"\n"
        os.write(fd, end + line + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def run(args):
    home = qmail_home(args.home)
    try:
        record = keygen(home, args.domain, args.selector, args.ed25519)
    except Usage as e:
        print("qmailctl dkim keygen: %s" % e, file=sys.stderr)
        return 100
    except (OSError, ControlError, ImportError) as e:
        print("qmailctl dkim keygen: %s" % e, file=sys.stderr)
        return 111
    print(record)
    return 0
