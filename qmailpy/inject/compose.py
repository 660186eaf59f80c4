"""Header completion and the envelope of an injected message (docs/submission.md "qmail-inject")."""
import time

from qmailpy.envelope import date822, quote2
from qmailpy.inject import addrlist
from qmailpy.inject.headers import (DROPPED, RECIPIENT_FIELDS, RESENT_RECIPIENT_FIELDS,
                                    SENDER_FIELDS, is_resent)
from qmailpy.inject.rewrite import Rewriter

# Recipient strategies: -a arguments, -h header, -H both, -A arguments if any else header.
ARGS, HEADER, BOTH, DEFAULT = "a", "h", "H", "A"


class InjectError(Exception):
    """Ends qmail-inject: .code is 100 (permanent) or 111 (temporary)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Composed:
    def __init__(self, header, sender, recipients):
        self.header = header            # the completed header fields, bytes
        self.sender = sender
        self.recipients = recipients


def _quote_name(name):
    return b'"' + name.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


def parse_argument(text, rw):
    """Addresses in a command-line recipient or -f value; InjectError if unreadable."""
    try:
        items = addrlist.parse(text)
    except addrlist.ParseError as e:
        raise InjectError(100, "unable to parse address %r: %s"
                          % (text.decode("utf-8", "replace"), e))
    return [rw(box.address) for box in addrlist.mailboxes(items)]


class _Fields:
    """The original header fields, as they will be written, and what compose() takes from them."""

    def __init__(self):
        self.kept = []            # (key, bytes)
        self.recipients = []      # header recipient addresses
        self.tocc = []            # To/Cc mailboxes (Mail-Followup-To)
        self.return_path = None


def _removed_by_flag(settings, key):
    """-f, -i, -s (QMAILINJECT): the original From, Message-ID, Return-Path go."""
    return ((settings.flag("f") and key == b"from")
            or (settings.flag("i") and key == b"message-id")
            or (settings.flag("s") and key == b"return-path"))


def _read_fields(header, settings, rw, wanted, header_recipients):
    """_Fields of the header: address fields parsed and rewritten, their addresses noted;
    InjectError for an unreadable sender field, or recipient field when the header's
    recipients are used (wanted: the recipient fields, Resent- or not)."""
    fields = _Fields()
    for field in header.fields:
        key = field.key
        if _removed_by_flag(settings, key):
            continue
        raw = field.raw
        if key in SENDER_FIELDS or key in RECIPIENT_FIELDS or key in RESENT_RECIPIENT_FIELDS:
            strict = key in SENDER_FIELDS or (header_recipients and key in wanted)
            raw = _read_address_field(field, rw, strict, key in wanted, fields)
        if key not in DROPPED:
            fields.kept.append((key, raw))
    return fields


def _read_address_field(field, rw, strict, wanted, fields):
    """The field as it will be written, its addresses rewritten; notes them in fields.
    An unreadable field stays as it was unless strict (then InjectError)."""
    try:
        items = addrlist.parse(field.body())
    except addrlist.ParseError as e:
        if strict:
            raise InjectError(100, "invalid header field (%s): %s"
                              % (e, field.raw.decode("utf-8", "replace").rstrip("\n")))
        return field.raw
    addrlist.rewrite(items, rw)
    boxes = list(addrlist.mailboxes(items))
    if wanted:
        fields.recipients.extend(b.address for b in boxes)
    if field.key in (b"to", b"cc"):
        fields.tocc.extend(boxes)
    if field.key == b"return-path" and boxes and fields.return_path is None:
        fields.return_path = boxes[0].address
    return field.name + b": " + addrlist.render(items, len(field.name) + 2) + b"\n"


def _added_fields(fields, settings, rw, resent, now, pid):
    """The fields qmail-inject adds when the header lacks them (Resent- ones for a resent message)."""
    keys = {key for key, _ in fields.kept}
    prefix = b"Resent-" if resent else b""
    lower = prefix.lower()
    added = []
    if lower + b"date" not in keys:
        added.append(prefix + b"Date: " + date822(now) + b"\n")
    if lower + b"message-id" not in keys:
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now)).encode()
        added.append(prefix + b"Message-ID: <%s.%d.qmail@%s>\n" % (stamp, pid, settings.idhost))
    if lower + b"from" not in keys:
        added.append(prefix + b"From: " + default_from(settings, rw) + b"\n")
    if lower + b"to" not in keys and lower + b"cc" not in keys:
        added.append(prefix + b"Cc: recipient list not shown: ;\n")
    if not resent and settings.mft and b"mail-followup-to" not in keys and \
            any(b.address.lower() in settings.mft for b in fields.tocc):
        followup = [addrlist.Mailbox(b.address) for b in fields.tocc]
        added.append(b"Mail-Followup-To: " + addrlist.render(followup, 18) + b"\n")
    return added


def _envelope_sender(sender, fields, settings, rw, now, pid):
    """-f's address, else the header's Return-Path, else the default sender."""
    if sender is not None:
        found = parse_argument(sender, rw)
        if len(found) > 1:
            raise InjectError(100, "more than one sender address in %r"
                              % sender.decode("utf-8", "replace"))
        return found[0] if found else b""
    if fields.return_path is not None:
        return fields.return_path
    return default_sender(settings, rw, now, pid)


def _envelope_recipients(strategy, args, fields, rw):
    recipients = []
    if strategy in (ARGS, BOTH):
        for arg in args:
            recipients.extend(parse_argument(arg, rw))
    if strategy in (HEADER, BOTH):
        recipients.extend(fields.recipients)
    return [r for r in recipients if r]


def compose(header, settings, strategy=DEFAULT, args=(), sender=None, now=None, pid=None):
    """The completed header and the envelope of a message qmail-inject reads; InjectError
    when it cannot be queued."""
    now = int(time.time()) if now is None else now
    pid = pid if pid is not None else __import__("os").getpid()
    rw = Rewriter(settings.defaulthost, settings.defaultdomain, settings.plusdomain)
    if strategy == DEFAULT:
        strategy = ARGS if args else HEADER
    resent = is_resent(header)
    wanted = RESENT_RECIPIENT_FIELDS if resent else RECIPIENT_FIELDS
    fields = _read_fields(header, settings, rw, wanted, strategy in (HEADER, BOTH))
    added = _added_fields(fields, settings, rw, resent, now, pid)
    envelope_sender = _envelope_sender(sender, fields, settings, rw, now, pid)
    recipients = _envelope_recipients(strategy, args, fields, rw)
    for address in [envelope_sender] + recipients:
        if b"\0" in address:           # qmail-queue's envelope ends addresses with NUL
            raise InjectError(100, "unable to queue address %r: it contains a NUL byte"
                              % address.decode("utf-8", "replace"))
    return Composed(b"".join(added) + b"".join(raw for _, raw in fields.kept),
                    envelope_sender, recipients)


def default_from(settings, rw):
    if settings.host:
        addr = settings.user + b"@" + settings.host
    else:
        addr = rw(settings.user)
    addr = quote2(addr)
    if not settings.name:
        return addr
    if settings.flag("c"):
        return addr + b" (" + settings.name.replace(b")", b"]").replace(b"(", b"[") + b")"
    return _quote_name(settings.name) + b" <" + addr + b">"


def default_sender(settings, rw, now, pid):
    local = settings.suser or settings.user
    if settings.flag("m"):
        local += b"-%d.%d" % (now, pid)
    if settings.flag("r"):
        local += b"-"
    host = settings.shost or settings.host
    sender = local + b"@" + host if host else rw(local)
    if settings.flag("r"):
        sender += b"-@[]"
    return sender
