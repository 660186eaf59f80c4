"""qmail-send's bounce messages (docs/qmail-send.md "Bounces"): who gets one, and its exact bytes.

The texts "Hi. This is the" and the "--- Below this line" separators are the
QSBMF markers bounce parsers look for; they are kept byte for byte.
"""
from qmailpy.envelope import date822, quote, quote2

TRIPLE = b"#@[]"


def bounce_base(sender):
    """The info sender with a VERP '-@[]' suffix removed ('owner-@host-@[]' -> 'owner-@host')."""
    if sender.endswith(b"-@[]"):
        return sender[:-4]
    return sender


def bounce_envelope(sender, doublebounceto, doublebouncehost):
    """(envelope sender, recipient) of the bounce for a message from `sender`; None = triple bounce.

    `sender` is the VERP-stripped info sender."""
    if sender == TRIPLE:
        return None
    if sender:
        return b"", sender
    return TRIPLE, doublebounceto + b"@" + doublebouncehost


def bounce_head(sender, recipient, bouncefrom, bouncehost, when=None):
    """Everything before the bounce notes."""
    if sender:
        explanation = (b"I'm afraid I wasn't able to deliver your message to the following addresses.\n"
                       b"This is a permanent error; I've given up. Sorry it didn't work out.\n")
    else:
        explanation = b"I tried to deliver a bounce message to this address, but the bounce bounced!\n"
    return b"".join((
        b"Date: ", date822(when), b"\n",
        b"From: ", quote(bouncefrom), b"@", bouncehost, b"\n",
        b"To: ", quote2(recipient), b"\n",
        b"Subject: failure notice\n",
        b"\n",
        b"Hi. This is the qmail-send program at ", bouncehost, b".\n",
        explanation,
        b"\n",
    ))


def bounce_separator(sender):
    """What comes between the notes and the original message."""
    if sender:
        line = b"--- Below this line is a copy of the message.\n\n"
    else:
        line = b"--- Below this line is the original bounce.\n\n"
    return line + b"Return-Path: <" + quote2(sender) + b">\n"


def copy_left_out(refusal):
    """In place of the separator and the message, when the queue permanently refused the
    bounce that carried the copy (a qmail-queue replacement's scanner, a size limit)."""
    return b"--- The copy of the message is left out: the queue refused it (" + refusal + b").\n"


def bounce_message(sender, recipient, bouncefrom, bouncehost, notes, message, when=None):
    """The complete bounce (for tests and small messages): head, notes, separator, message."""
    return (bounce_head(sender, recipient, bouncefrom, bouncehost, when) + notes
            + bounce_separator(sender) + message)
