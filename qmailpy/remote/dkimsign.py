"""DKIM signatures for a message qmail-remote sends (docs/delivery.md "DKIM signing").

The signing domains come from the message's From: header (control/dkimkeys,
qmailpy/dkimkeys.py); each key gives one DKIM-Signature (RFC 6376, Ed25519 by
RFC 8463), relaxed/relaxed, over the header fields RFC 6376 §5.4.1 recommends with
From signed once more than it occurs, so no From can be added. The signature is
computed over the message as it goes on the wire: every line ending CRLF (a lone
CR or LF is sent as CRLF, smtp.encode_lines). dkimpy is imported only when a key
applies, so qmail-remote starts as fast as before for mail that is not signed.

prefix(...) returns the DKIM-Signature fields to put before the message (LF line
ends, like the queue) or raises Refused with the record that ends the run: Z when
a key cannot be used (never unsigned mail for a domain that should be signed),
D when the message itself cannot be signed.
"""
import os

from qmailpy import dkimkeys

READ_CHUNK = 65536


class Refused(Exception):
    """args[0]: the record (Z or D ...) of a message that must not go out unsigned."""


def unfolded_fields(header, name):
    """The values of the header fields called name (bytes, lowercase, no colon), unfolded."""
    values = []
    current = None
    for line in header.split(b"\n"):
        if line[:1] in (b" ", b"\t"):
            if current is not None:
                current.append(line)
            continue
        current = None
        colon = line.find(b":")
        if colon > 0 and line[:colon].rstrip(b" \t").lower() == name:
            current = [line[colon + 1:]]
            values.append(current)
    return [b" ".join(v) for v in values]


def from_domains(header):
    """The domains (lowercase bytes, in order, each once) of the From: addresses of a header."""
    from email.utils import getaddresses
    found = []
    texts = [v.decode("latin-1") for v in unfolded_fields(header, b"from")]
    for _, address in getaddresses(texts):
        domain = address.rpartition("@")[2].strip().rstrip(".").lower().encode("latin-1")
        if "@" in address and domain and domain not in found:
            found.append(domain)
    return found


def signers(table, header):
    """[(Entry)] of the keys that must sign a message with this header."""
    chosen = []
    for domain in from_domains(header):
        chosen.extend(e for e in dkimkeys.for_domain(table, domain) if e not in chosen)
    return chosen


def read_all(fd, message):
    """The whole message on fd (message: smtputf8.read_message's result, fd where it left it)."""
    if message.prefix:
        parts = [message.prefix]
        while True:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
    try:
        at = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return b""            # a pipe read_message found empty
    parts = []
    while True:
        chunk = os.pread(fd, READ_CHUNK, at)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        at += len(chunk)


def _report(text):
    return text.replace(b"\n", b" ")


def sign(data, chosen):
    """DKIM-Signature fields (bytes, LF line ends) for message data by every entry of chosen."""
    keys = []
    for entry in chosen:
        shown = entry.keyfile
        try:
            algorithm, key = dkimkeys.load(os.fsdecode(entry.keyfile))
        except dkimkeys.KeyProblem as e:
            raise Refused(b"ZUnable to use DKIM key " + _report(shown) + b" for " + entry.domain
                          + b": " + _report(str(e).encode("utf-8", "replace")) + b". (#4.3.0)\n")
        keys.append((entry, algorithm, key))
    try:
        import dkim
    except ImportError as e:
        raise Refused(b"ZDKIM signing is not available here: "
                      + _report(str(e).encode("utf-8", "replace")) + b". (#4.3.0)\n") from None
    wire = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    fields = []
    for entry, algorithm, key in keys:
        try:
            field = dkim.sign(wire, entry.selector, entry.domain, key,
                              canonicalize=(b"relaxed", b"relaxed"),
                              signature_algorithm=algorithm)
        except dkim.MessageFormatError as e:
            raise Refused(b"DSorry, the message header cannot be DKIM-signed: "
                          + _report(str(e).encode("utf-8", "replace"))[:200] + b". (#5.6.0)\n")
        except (dkim.DKIMException, ValueError) as e:
            raise Refused(b"ZUnable to sign with DKIM key " + _report(entry.keyfile) + b" for "
                          + entry.domain + b": " + _report(str(e).encode("utf-8", "replace"))
                          + b". (#4.3.0)\n")
        fields.append(field.replace(b"\r\n", b"\n"))
    return b"".join(fields)


def prefix(table, fd, message):
    """What goes on the wire before the rest of fd (message.prefix's new value) once the
    message is signed for every key its From: domains have in table: the signatures, and
    when fd cannot seek (a pipe) the whole message read from it. A message with no key
    is not read beyond its header."""
    from qmailpy.remote.smtputf8 import HEADER_SCAN, header_end, read_header
    # from a pipe, read_message() kept what it read up to the header's end
    start = message.prefix if message.prefix else read_header(fd)[0]
    data = None
    if header_end(start) is None and len(start) >= HEADER_SCAN:
        data = read_all(fd, message)    # a header longer than that: its From may come late
        start = data
    end = header_end(start)
    chosen = signers(table, start if end is None else start[:end])
    if not chosen:
        return message.prefix if data is None else data if message.prefix else b""
    if data is None:
        data = read_all(fd, message)
    fields = sign(data, chosen)
    return fields + data if message.prefix else fields
