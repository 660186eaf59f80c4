"""qmail-remote's STARTTLS policy and TLS contexts (docs/delivery.md "STARTTLS").

Without a policy TLS is opportunistic: used when the peer offers STARTTLS, the
certificate not checked. control/tlsdestinations lists the domains whose mail
must go encrypted to a verified peer: each line is `domain` (certificates
checked against the system's default CA paths) or `domain:cafile` (against that
PEM file, relative to QMAILHOME); keys match as in control/smtproutes (the
domain, each `.suffix`, the empty key for all). For those, a certificate that
does not verify or names neither the mail exchanger nor the domain, or a peer
that does not offer STARTTLS, is a temporary failure of that host.

ssl is imported only when a peer offers STARTTLS.
"""
import os

from qmailpy.remote.routes import candidate_keys

CONTROL = "tlsdestinations"


class Policy:
    """What one run needs: required (bool), the CA file (None: system paths), the names
    a certificate may carry (bytes, lowercase)."""

    def __init__(self, required=False, cafile=None, names=()):
        self.required, self.cafile = required, cafile
        self.names = [n.lower() for n in names if n]


def policy_table(lines):
    """{lowercased key: cafile or b''} from the control file's lines."""
    table = {}
    for line in lines or ():
        key, _, cafile = line.partition(b":")
        table[key.strip().lower()] = cafile.strip()
    return table


def find_policy(table, domain):
    """(required, cafile or None) for mail to domain."""
    for key in candidate_keys(domain):
        cafile = table.get(key)
        if cafile is not None:
            return True, (cafile or None)
    return False, None


def context(policy):
    """An ssl.SSLContext for the policy: the ssl module's client defaults (TLS 1.2 or
    later); for a required policy, certificates verified against its CA file or the
    system's, host names checked afterwards by names_match()."""
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if policy.required:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if policy.cafile:
            ctx.load_verify_locations(cafile=os.fsdecode(policy.cafile))
        else:
            ctx.set_default_verify_paths()
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _name_matches(pattern, name):
    """RFC 6125: exact (case-insensitive), or '*' as the whole leftmost label."""
    pattern = pattern.lower().rstrip(".")
    if pattern == name:
        return True
    if pattern.startswith("*.") and "*" not in pattern[2:]:
        head, dot, rest = name.partition(".")
        return bool(head) and dot == "." and rest == pattern[2:]
    return False


def cert_names(cert):
    """The DNS names of a verified certificate (getpeercert()): its subjectAltName
    dNSName entries, else its commonName."""
    names = [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
    if names:
        return names
    return [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]


def names_match(cert, wanted):
    """True if the certificate names one of wanted (bytes)."""
    for name in wanted:
        try:
            text = name.decode("ascii").rstrip(".").lower()
        except UnicodeDecodeError:
            continue
        if any(_name_matches(pattern, text) for pattern in cert_names(cert)):
            return True
    return False
