"""SPF, DKIM and DMARC checks on reception (docs/submission.md "Sender authentication").

On when control/authcheck exists (its lines name the checks: spf, dkim, dmarc; an
empty file means all three), for mail not from a relay client or an authenticated
user. SPF (pyspf, RFC 7208) checks the MAIL FROM domain, the HELO name when MAIL
FROM is <>, at MAIL; DKIM (dkimpy) verifies every DKIM-Signature, RSA and Ed25519,
after DATA; DMARC (RFC 7489) takes the From domain's policy record through
authheaders (which also finds the organisational domain, from the Public Suffix
List copy it ships) and decides alignment here, relaxed or strict as the record
says. Every lookup goes through qmailpy/resolver.py (control/dnsresolvers,
control/timeoutdns); a lookup that fails temporarily is a temperror, never a pass.

The results go into one Authentication-Results header (RFC 8601) whose authserv-id
is control/me, put right after qmail-smtpd's Received line; an
Authentication-Results header that arrives with our authserv-id is removed (it is
forged), from a relay client's mail too. Rejection is the administrator's choice:
control/spfreject 1 refuses an SPF fail at MAIL (550 #5.7.23), control/dmarcreject 1
refuses a DMARC fail under p=reject after DATA (550 #5.7.1); where rejection is
asked for, a temperror is a 451. Otherwise mail is accepted with the results recorded.

DKIM needs the message whole in memory: messages over VERIFY_MAX bytes are not
verified (dkim=policy); their DMARC result rests on SPF alone. At most MAX_SIGNATURES
signatures of a message are verified.
"""
import socket

from qmailpy.home import ControlError, control_int, control_list, control_value

CONTROL = "authcheck"
SPF_REJECT = "spfreject"
DMARC_REJECT = "dmarcreject"
CHECKS = (b"spf", b"dkim", b"dmarc")
VERIFY_MAX = 10 << 20       # bytes of a message DKIM verifies; larger: dkim=policy
MAX_SIGNATURES = 8          # DKIM-Signatures verified (each may cost a key lookup); more: policy
HEADER_MAX = 1 << 20        # bytes of header read to find forged headers and From:

R_SPF_FAIL = b"550 SPF check failed for %s (#5.7.23)\r\n"
R_SPF_TEMP = b"451 temporary SPF lookup error for %s (#4.7.24)\r\n"
R_DMARC_FAIL = b"550 DMARC policy of %s rejects this message (#5.7.1)\r\n"
R_DMARC_TEMP = b"451 temporary DMARC lookup error for %s (#4.7.1)\r\n"
R_SPOOL = b"451 unable to spool the message (#4.3.0)\r\n"


class Temporary(Exception):
    """A lookup failed temporarily (timeout, SERVFAIL, no server)."""


class Settings:
    """The controls of the checks; built only when control/authcheck exists."""

    def __init__(self, home):
        lines = control_list(home, CONTROL, [])
        self.checks = set()
        for line in lines:
            word = line.strip().lower()
            if word not in CHECKS:
                raise ControlError("control/%s: %r is not spf, dkim or dmarc" % (CONTROL, line))
            self.checks.add(word)
        if not self.checks:
            self.checks = set(CHECKS)
        self.spf_reject = control_int(home, SPF_REJECT, 0) > 0
        self.dmarc_reject = control_int(home, DMARC_REJECT, 0) > 0
        self.me = control_value(home, "me") or b"localhost"
        from qmailpy import resolver
        self.dns = resolver.settings(home)


class Checks:
    """One session's checks: SPF at MAIL (at_mail), DKIM and DMARC after DATA (after_data)."""

    def __init__(self, home):
        self.settings = Settings(home)
        self._lookup = None
        self.spf = None             # (result, identity word, identity) of this transaction
        self.unverified = 0         # DKIM-Signatures of the message beyond MAX_SIGNATURES
        self.log = b""

    def lookup(self, name, rdtype):
        """Answers for name (str or bytes); [] when there are none; Temporary on a failure."""
        from qmailpy.remote.dns import DNSHard, DNSSoft, resolver_lookup
        if self._lookup is None:
            self._lookup = resolver_lookup(config=self.settings.dns)
        if isinstance(name, str):
            name = name.encode("ascii", "replace")
        try:
            return self._lookup(name.rstrip(b"."), rdtype)
        except DNSHard:
            return []
        except DNSSoft as e:
            raise Temporary(str(e)) from None

    def txt(self, name):
        return [b"".join(rd.strings) for rd in self.lookup(name, "TXT")]

    # -- SPF ---------------------------------------------------------------
    def at_mail(self, ip, mailfrom, helo):
        """SPF of the transaction; a refusal reply, or None to go on."""
        self.spf = None
        self.log = b""
        if b"spf" not in self.settings.checks:
            return None
        if mailfrom:
            word, identity = b"smtp.mailfrom", mailfrom
        else:
            word, identity = b"smtp.helo", helo
        result, reason = self.spf_result(ip, mailfrom, helo)
        self.spf = (result, word, identity)
        shown = safe(identity.rpartition(b"@")[2] or b"unknown")
        if self.settings.spf_reject and result in ("fail", "temperror"):
            self.log = b"spf %s: %s from %s: %s" % (result.encode(), safe(identity), ip,
                                                    safe(reason.encode("utf-8", "replace"), 32))
            return (R_SPF_FAIL if result == "fail" else R_SPF_TEMP) % shown
        return None

    def spf_result(self, ip, mailfrom, helo):
        """(pyspf's result word, its explanation)."""
        if not _is_ip(ip) or not (mailfrom or helo):
            return "none", "no address or identity to check"
        import spf
        spf.DNSLookup = self._spf_dns
        timeout = self.settings.dns.timeout
        try:
            q = spf.query(i=ip.decode("ascii"), s=mailfrom.decode("utf-8", "replace"),
                          h=helo.decode("utf-8", "replace"), timeout=timeout, querytime=timeout)
            result, _, text = q.check()
        except Temporary as e:
            return "temperror", str(e)
        except Exception as e:        # pyspf's own errors on input it cannot parse
            return "permerror", str(e)
        return result, text

    def _spf_dns(self, name, qtype, strict=True, timeout=None):
        """pyspf's DNSLookup on our resolver: [((name, type), data)]."""
        import spf
        try:
            answers = self.lookup(name, qtype)
        except Temporary as e:
            raise spf.TempError("DNS %s" % e) from None
        found = []
        for rd in answers:
            if qtype in ("A", "AAAA"):
                found.append(((name, qtype), rd.address))
            elif qtype == "MX":
                found.append(((name, qtype), (rd.preference, rd.exchange)))
            elif qtype == "PTR":
                found.append(((name, qtype), rd.target.to_text(True)))
            elif qtype == "TXT":
                found.append(((name, qtype), rd.strings))
        return found

    # -- DKIM and DMARC -----------------------------------------------------
    def after_data(self, spool, checked=True):
        """(None, write) where write(sink) puts out the spooled message (qmail-smtpd's
        Received line first) with the Authentication-Results header after that line and
        without forged ones; or (a refusal reply, None). Unchecked (a relay client's
        message): only the forged headers are taken out."""
        self.log = b""
        if not checked:
            self.spf = None
        try:
            header, rest = _split(spool)
            message = None
            if spool.size <= VERIFY_MAX:
                message = header + b"".join(bytes(p) for p in rest)
        except OSError:
            return R_SPOOL, None
        fields = header_fields(header)
        kept = [f for f in fields if not self._forged(f)]
        added = b""
        if checked:
            results, refusal = self.evaluate(fields, message)
            if refusal is not None:
                return refusal, None
            added = b"Authentication-Results: " + self.settings.me + b";" + \
                (b";".join(results) if results else b" none") + b"\n"
        head = b"".join(kept[:1]) + added + b"".join(kept[1:])

        def write(sink):
            sink(head)
            if message is not None:
                sink(message[len(header):])
                return
            _, body = _split(spool)
            for piece in body:
                sink(piece)
        return None, write

    def _forged(self, field):
        name, _, value = field.partition(b":")
        return name.strip().lower() == b"authentication-results" and \
            authserv_id(value) == self.settings.me.lower()

    def evaluate(self, fields, message):
        """([result texts], None) or ([], a refusal reply)."""
        checks = self.settings.checks
        results = []
        if self.spf is not None:
            result, word, identity = self.spf
            results.append(b"\n\tspf=%s %s=%s" % (result.encode(), word, value(identity)))
        dkim = []
        if b"dkim" in checks:
            if message is None:
                results.append(b"\n\tdkim=policy reason=\"not verified: over %d bytes\"" % VERIFY_MAX)
            else:
                dkim = self.verify(message)
                results += [b"\n\tdkim=%s header.d=%s header.s=%s header.b=%s" % (
                    r.encode(), value(d), value(s), value(b[:8])) for r, d, s, b in dkim]
                if not dkim:
                    results.append(b"\n\tdkim=none")
                if self.unverified:
                    results.append(b"\n\tdkim=policy reason=\"%d signatures after the first %d not verified\""
                                   % (self.unverified, MAX_SIGNATURES))
        if b"dmarc" in checks:
            result, domain, policy = self.dmarc(fields, dkim)
            results.append(b"\n\tdmarc=%s" % result.encode() +
                           (b" header.from=%s" % value(domain.encode()) if domain else b""))
            if domain and self.settings.dmarc_reject:
                if result == "fail" and policy == "reject":
                    self.log = b"dmarc fail: %s under p=reject" % safe(domain.encode())
                    return [], R_DMARC_FAIL % safe(domain.encode())
                if result == "temperror":
                    self.log = b"dmarc temperror: %s" % safe(domain.encode())
                    return [], R_DMARC_TEMP % safe(domain.encode())
        return results, None

    def verify(self, message):
        """[(result, d, s, b)] of every DKIM-Signature."""
        import logging

        import dkim
        logger = logging.getLogger("qmailpy.dkimverify")
        logger.propagate = False
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())
        self.unverified = 0
        crlf = message.replace(b"\n", b"\r\n")
        try:
            d = dkim.DKIM(crlf, logger=logger)
        except dkim.DKIMException:
            return []
        signatures = [v for n, v in d.headers if n.lower() == b"dkim-signature"]
        found = []
        self.unverified = max(0, len(signatures) - MAX_SIGNATURES)
        for idx, sig in enumerate(signatures[:MAX_SIGNATURES]):
            tags = _tags(sig)
            missing = []

            def key(name, timeout=5):
                keys = [t for t in self.txt(name) if not t.startswith(b"v=") or t.startswith(b"v=DKIM1")]
                if not keys:
                    missing.append(name)
                    return None
                return keys[0]
            try:
                d.verify_headerprep(idx)            # the signature's own syntax and tags
            except Exception:
                found.append(("permerror", tags.get(b"d", b""), tags.get(b"s", b""), tags.get(b"b", b"")))
                continue
            try:
                ok = d.verify(idx=idx, dnsfunc=key)
                result = "pass" if ok else ("permerror" if missing else "fail")
            except Temporary:
                result = "temperror"
            except dkim.ValidationError:        # of a well-formed signature: does not verify
                result = "fail"
            except Exception:       # dkimpy's other errors and what garbage tags make it raise
                result = "permerror"
            found.append((result, tags.get(b"d", b""), tags.get(b"s", b""), tags.get(b"b", b"")))
        return found

    def dmarc(self, fields, dkim):
        """(result, From domain or "", policy) per RFC 7489."""
        domain = from_domain(fields)
        if domain is None:
            return "permerror", "", ""
        from authheaders import dmarc_per_from
        from authheaders.dmarc_lookup import DMARCException
        get_org_domain = org_domain_finder()
        try:
            _, _, found_at, _, record, _ = dmarc_per_from(domain, dnsfunc=self._dmarc_dns,
                                                           policy_only=True)
        except Temporary:
            return "temperror", domain, ""
        except DMARCException:
            return "permerror", domain, ""
        if not record or not record.get("p"):
            return "none", domain, ""
        # p= for the From domain's own record, sp= (else p=) for one found at its
        # organisational domain (authheaders applies sp= to both)
        policy = record["p"] if found_at == "Used From Domain Record" else record.get("sp", record["p"])
        org = get_org_domain(domain)

        def aligned(other, mode):
            other = other.lower().rstrip(".")
            return other == domain if mode == "s" else get_org_domain(other) == org
        if self.spf is not None and self.spf[0] == "pass" and self.spf[1] == b"smtp.mailfrom":
            if aligned(self.spf[2].rpartition(b"@")[2].decode("utf-8", "replace"),
                       record.get("aspf", "r")):
                return "pass", domain, policy
        for result, d, _, _ in dkim:
            if result == "pass" and aligned(d.decode("ascii", "replace"), record.get("adkim", "r")):
                return "pass", domain, policy
        return "fail", domain, policy

    def _dmarc_dns(self, name, qtype="TXT"):
        """authheaders' dnsfunc: the one DMARC record at _dmarc.X as text (None for none or
        several); for a name without _dmarc. (its np check), whether the name exists."""
        if not name.startswith("_dmarc."):
            return "exists" if any(self.lookup(name, t) for t in ("A", "MX", "AAAA")) else None
        records = [t for t in self.txt(name) if t.startswith(b"v=DMARC1")]
        if len(records) != 1:
            return None
        return records[0].decode("utf-8", "replace")


_org_domain = []


def org_domain_finder():
    """authheaders' get_org_domain without its cost: it reads and parses its Public Suffix List
    (a quarter of a second) at every call, three times a message; here once a process, and
    authheaders' own lookups are pointed at this one."""
    if not _org_domain:
        import authheaders
        from authheaders import dmarc_lookup
        from publicsuffix2 import PublicSuffixList
        try:
            from authheaders.findpsl import location       # a distribution's own list
        except ModuleNotFoundError:
            import importlib.resources
            location = importlib.resources.files("authheaders") / "public_suffix_list.txt"
        with open(location, encoding="utf-8") as f:
            psl = PublicSuffixList(f)

        def get_org_domain(domain):
            return psl.get_public_suffix(domain)
        dmarc_lookup.get_org_domain = authheaders.get_org_domain = get_org_domain
        _org_domain.append(get_org_domain)
    return _org_domain[0]


def _is_ip(ip):
    text = ip.decode("ascii", "replace")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, text)
            return True
        except OSError:
            pass
    return False


def _tags(sig):
    tags = {}
    for part in sig.split(b";"):
        name, eq, val = part.partition(b"=")
        if eq:
            tags.setdefault(name.strip(), b"".join(val.split()))
    return tags


def _split(spool):
    """(header section with its blank line, an iterator over the rest) of a Spool."""
    pieces = spool.pieces()
    buf = bytearray()
    for piece in pieces:
        buf += piece
        end = buf.find(b"\n\n")
        if buf.startswith(b"\n"):
            end = -1
            break
        if end >= 0 or len(buf) >= HEADER_MAX:
            break
    end = buf.find(b"\n\n")
    cut = 0 if buf.startswith(b"\n") else (end + 2 if end >= 0 else len(buf))
    head, tail = bytes(buf[:cut]), bytes(buf[cut:])

    def rest():
        if tail:
            yield tail
        yield from pieces
    return head, rest()


def header_fields(header):
    """The header section as whole fields (a line and its continuation lines)."""
    fields = []
    for line in header.splitlines(keepends=True):
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line
        else:
            fields.append(line)
    return fields


def authserv_id(value):
    """The authserv-id of an Authentication-Results value, lower case (comments skipped)."""
    text = value.strip()
    while text.startswith(b"("):
        depth, at = 0, 0
        for at, ch in enumerate(text):
            depth += (ch == 40) - (ch == 41)
            if depth == 0:
                break
        text = text[at + 1:].lstrip()
    end = len(text)
    for stop in (b";", b" ", b"\t", b"\n", b"("):
        at = text.find(stop)
        if 0 <= at < end:
            end = at
    return text[:end].lower()


def from_domain(fields):
    """The domain of the one address in the one From: field, lower case; None otherwise."""
    from email.utils import getaddresses
    values = [f.partition(b":")[2] for f in fields if f.partition(b":")[0].strip().lower() == b"from"]
    if len(values) != 1:
        return None
    addresses = [a for _, a in getaddresses([values[0].decode("utf-8", "replace")]) if a]
    if len(addresses) != 1 or "@" not in addresses[0]:
        return None
    domain = addresses[0].rpartition("@")[2].strip().lower().rstrip(".")
    return domain or None


def safe(text, low=33):
    """Printable ASCII only (for replies and log lines); low=32 keeps spaces."""
    return bytes(ch if low <= ch < 127 else 0x3F for ch in text)[:200]


def value(text):
    """An RFC 8601 property value: a token as it is, anything else quoted."""
    text = safe(text)
    if text and all(ch not in b'()<>,;:\\"[]' for ch in text.replace(b"@", b"")):
        return text
    return b'"' + text.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


def preload():
    """Import what the checks need (qmail-smtpd-listen, once for all its session workers)."""
    import email.utils          # noqa: F401
    import dns.rdata
    import dns.rdataclass
    import dns.rdatatype
    for rdtype in ("TXT", "A", "AAAA", "MX", "PTR"):     # dnspython loads these at first use
        dns.rdata.get_rdata_class(dns.rdataclass.IN, dns.rdatatype.from_text(rdtype))
    import qmailpy.queue.spool  # noqa: F401   (the message waits there for the checks)
    org_domain_finder()
    import dkim                 # noqa: F401
    import spf                  # noqa: F401
    import qmailpy.remote.dns   # noqa: F401
    import qmailpy.resolver     # noqa: F401
