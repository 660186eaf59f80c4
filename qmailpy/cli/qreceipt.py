"""qreceipt deliveryaddress: answer a request for a delivery notice (qreceipt(1)).

Used in a .qmail file as ``|qreceipt address``. As qmail's: when the message's
header has a Notice-Requested-Upon-Delivery-To field naming exactly
`deliveryaddress`, and $SENDER is neither empty nor #@[], queue a success
notice to $SENDER (envelope sender empty) that quotes the message's
Message-ID field. Exit 0 (also when no notice is asked for); 100 for a usage
error, a field that does not parse or a permanent queue failure; 111 for a
temporary one.
"""
import os
import sys

PROG = "qreceipt: "
REQUEST = b"notice-requested-upon-delivery-to"


class Exit(Exception):
    def __init__(self, code, text=None):
        super().__init__(text)
        self.code, self.text = code, text


def notice(target, sender, message_id):
    """The notice's bytes (qmail's text, sender quoted by quote2)."""
    from qmailpy.envelope import quote2
    quoted = quote2(sender)
    text = (b"From: DELIVERY NOTICE SYSTEM <" + quoted + b">\nTo: <" + quoted + b">\n"
            b"Subject: success notice\n\n"
            b"Hi! This is the qreceipt program. Your message was delivered to the\n"
            b"following address: " + target + b". Thanks for asking.\n")
    if message_id is not None:
        text += b"Your " + message_id
    return text


def wanted(header, target):
    """(asked for a notice to target?, the Message-ID field's raw bytes or None)."""
    from qmailpy.inject.addrlist import ParseError, mailboxes, parse
    asked, message_id = False, None
    for field in header.fields:
        if field.key == b"message-id":
            message_id = field.raw
        elif field.key == REQUEST:
            try:
                boxes = list(mailboxes(parse(field.body())))
            except ParseError:
                raise Exit(100, "fatal: unable to parse this: " + os.fsdecode(field.raw[:-1])) from None
            asked = asked or any(box.address == target for box in boxes)
    return asked, message_id


def qreceipt(args):
    if not args:
        raise Exit(100, "usage: qreceipt deliveryaddress")
    target = os.fsencode(args[0])
    sender = os.environb.get(b"SENDER")
    if sender is None:
        raise Exit(100, "usage: qreceipt deliveryaddress")
    from qmailpy.inject.headers import read_header
    try:
        header = read_header(open(0, "rb", closefd=False))
    except OSError:
        raise Exit(111, "fatal: read error") from None
    asked, message_id = wanted(header, target)
    if not asked or sender in (b"", b"#@[]"):
        return
    from qmailpy.home import qmail_home
    from qmailpy.queue.client import QueueClient, QueueStartError
    try:
        qq = QueueClient(qmail_home())
        qq.write(notice(target, sender, message_id))
        result = qq.finish(b"", [sender])
    except QueueStartError:
        raise Exit(111, "fatal: unable to fork") from None
    if not result.ok:
        if result.permanent:
            raise Exit(100, "fatal: permanent qmail-queue error")
        raise Exit(111, "fatal: temporary qmail-queue error")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        qreceipt(argv)
    except Exit as e:
        sys.stderr.write(PROG + e.text + "\n")
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
