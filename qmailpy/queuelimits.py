"""The queue's limits on one message's envelope (docs/queue-format.md "Envelope limits").

Whatever qmail-queue accepts, every record the message will later need must fit:
on the log backend a record's payload is at most MAX_RECORD_PAYLOAD bytes, and
the largest record a message ever gets is a snapshot (PREPROCESSED, REPLACEMENT)
holding the sender, every recipient as routed, and the bounce notes of every
recipient that failed. So each recipient is charged what it can cost in the
largest snapshot (recipient_cost), and an envelope is accepted only while the
charges add up to at most ENVELOPE_BUDGET. Besides that byte bound, control/maxrcpt
caps the number of recipients (DEFAULT_MAXRCPT, Postfix's default). qmail-queue,
qmail-qmqpd (through qmail-queue's code) and qmail-smtpd (at each RCPT) all check
with EnvelopeBudget, so what one accepts the others accept too.

Imports stay small: qmail-queue and qmail-smtpd load this per message.
"""
from qmailpy.envelope import MAX_ADDRESS

MAXRCPT_CONTROL = "maxrcpt"
DEFAULT_MAXRCPT = 1000        # recipients per message when control/maxrcpt is absent (Postfix: 1000)

MAX_RECORD_PAYLOAD = 64 * 1024 * 1024     # the log backend's largest record payload

# A stored delivery report (a bounce note's text) is cut to this many bytes: qmail-send
# keeps 10000 bytes of a report, and a note may add "I'm not going to try again ...".
BOUNCE_TEXT_MAX = 10240
BOUNCE_TEXT_CUT = b"\n[report cut: too long]\n"

# How much qmail-send's rewriting may lengthen an address ('@' + envnoathost, or a
# virtualdomains prepend and '-'). Longer control lines are not accounted for: a
# message they make too large is set aside by qmail-send, never a crash.
REWRITE_ALLOWANCE = 1024

# Bytes of a snapshot that do not depend on the recipients: the fixed fields
# (time, n, previous position, schedule, birth, qp, uid, size; 65 bytes), the
# sender's and the notes' lengths, the ended mask and two channels' counts.
SNAPSHOT_FIXED = 65 + 4 + 4 + 1 + 2 * 4
# Per recipient in a snapshot: the done byte and the address's length.
_RCPT_FIXED = 1 + 4
# Per recipient's bounce note: "<" address ">:\n" text ["\n"] "\n" (envelope.bounce_note).
_NOTE_FIXED = 1 + 3 + 1 + 1

ENVELOPE_BUDGET = MAX_RECORD_PAYLOAD - SNAPSHOT_FIXED - MAX_ADDRESS     # what recipients may use


def recipient_cost(length):
    """What a recipient of `length` bytes can take in a message's largest snapshot:
    its routed address, and its bounce note (the same address and a report)."""
    routed = length + REWRITE_ALLOWANCE
    return _RCPT_FIXED + routed + _NOTE_FIXED + routed + len(BOUNCE_TEXT_CUT) + BOUNCE_TEXT_MAX


def bounce_text(text):
    """A delivery report as a bounce note stores it: at most BOUNCE_TEXT_MAX bytes
    (plus the cut's note), so that a message's notes stay within ENVELOPE_BUDGET."""
    if len(text) <= BOUNCE_TEXT_MAX:
        return text
    return text[:BOUNCE_TEXT_MAX] + BOUNCE_TEXT_CUT


def read_maxrcpt(home):
    """control/maxrcpt: the cap on recipients per message (0: none beyond the byte
    bound). ControlError (qmailpy.home) when the file cannot be read."""
    from qmailpy.home import control_int
    return control_int(home, MAXRCPT_CONTROL, DEFAULT_MAXRCPT)


class EnvelopeBudget:
    """Recipients admitted to one envelope, one at a time."""
    __slots__ = ("maxrcpt", "count", "used")

    def __init__(self, maxrcpt):
        self.maxrcpt = maxrcpt
        self.count = 0
        self.used = 0

    def admit(self, length):
        """Charge a recipient of `length` bytes; False (nothing charged) if it does not fit."""
        cost = recipient_cost(length)
        if self.maxrcpt and self.count >= self.maxrcpt or self.used + cost > ENVELOPE_BUDGET:
            return False
        self.count += 1
        self.used += cost
        return True
