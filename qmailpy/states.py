"""THE table of queue states S1–S5 (docs/queue-format.md "State machine", docs/architecture.md "The state table").

Everything that needs to know what state a message is in, or whether a move
between states is legal, asks this module: the directory backend classifies an
inode from the files present, the log backend from its records, and the audit
checks every transition it observes against TRANSITIONS.
"""

S1, S2, S3, S4, S5 = "S1", "S2", "S3", "S4", "S5"
# Held (qmailctl queue hold, docs/qmail-send.md "Commands"): S5 kept from delivery,
# with hold/n on the directory backend (the held bit of its snapshot on the log
# backend, whose readers show it as S5 with "held" true). A hold asked at queueing
# (docs/queue-format.md "Hold at queueing") is written by preprocessing before todo/n
# goes, so S4 may already have hold/n and moves straight to HELD.
HELD = "HELD"
STATES = (S1, S2, S3, S4, S5, HELD)

DESCRIPTION = {
    S1: "no message",
    S2: "mess written, no envelope",
    S3: "envelope being written (intd)",
    S4: "queued (todo)",
    S5: "preprocessed (info)",
    HELD: "preprocessed and held (info, hold)",
}

# The files of one message number in the directory backend.
FILES = ("mess", "intd", "todo", "info", "local", "remote", "bounce", "hold")

# For each state: True = must exist, False = must not exist, None = either.
PRESENCE = {
    S1: dict(mess=False, intd=False, todo=False, info=False, local=False, remote=False, bounce=False,
             hold=False),
    S2: dict(mess=True, intd=False, todo=False, info=False, local=False, remote=False, bounce=False,
             hold=False),
    S3: dict(mess=True, intd=True, todo=False, info=False, local=False, remote=False, bounce=False,
             hold=False),
    S4: dict(mess=True, intd=None, todo=True, info=None, local=None, remote=None, bounce=False,
             hold=None),
    S5: dict(mess=True, intd=False, todo=False, info=True, local=None, remote=None, bounce=None,
             hold=False),
    HELD: dict(mess=True, intd=False, todo=False, info=True, local=None, remote=None, bounce=None,
               hold=True),
}

# Legal moves between different states, each with the program that makes it and how.
TRANSITIONS = {
    (S1, S2): ("qmail-queue", "link pid/ file to mess/S/n"),
    (S2, S3): ("qmail-queue", "create intd/n"),
    (S3, S4): ("qmail-queue", "link intd/n to todo/n"),
    (S4, S5): ("qmail-clean", "unlink todo/n after qmail-send wrote info, local, remote"),
    # qmail-send's, as the hold is: it writes hold/n and logs `hold msg` (qmail-clean then
    # unlinks todo/n, as for S4 -> S5), so the audit counts the move as logged
    (S4, HELD): ("qmail-send", "preprocess a message whose queueing asked a hold: info, local, "
                 "remote and hold/n, then todo/n unlinked (log: a PREPROCESSED with the held bit)"),
    (S5, S2): ("qmail-send", "unlink info/S/n when every recipient is finished"),
    (S2, S1): ("qmail-clean", "unlink mess/S/n (foop request, or 36-hour cleanup)"),
    (S3, S2): ("qmail-queue", "unlink intd/n after a read or write error (or qmail-clean foop)"),
    (S5, HELD): ("qmail-send", "hold: create hold/n (log: a REPLACEMENT with the held bit)"),
    (HELD, S5): ("qmail-send", "release or requeue: unlink hold/n (log: a REPLACEMENT without it)"),
    # delete, terminal: channel files, bounce/n, hold/n and info/S/n unlinked, then
    # qmail-clean removes mess/S/n (log: a FINISH); no end msg is logged
    (S5, S1): ("qmail-send", "delete: unlink channel files, bounce, info; qmail-clean unlinks mess"),
    (HELD, S1): ("qmail-send", "delete a held message, as from S5"),
    # a message not preprocessed (one qmail-send set aside, or any while qmail-send is
    # down: qmailctl does it): todo/ and intd/ unlinked, then mess/ (log: a FINISH)
    (S4, S1): ("qmail-send", "delete a queued message: unlink todo, intd, mess (log: a FINISH)"),
}

# Moves that stay in one state but change its files (preprocessing redone after
# a crash, deliveries marking recipients done, bounce notes, channel files
# finished). They are legal; listed so the audit can name them.
SELF_MOVES = {
    S4: ("qmail-send", "write info/local/remote, and hold/n when its queueing asked a hold "
                       "(preprocessing, possibly repeated)"),
    S5: ("qmail-send", "mark recipients done, append bounce notes, unlink channel files"),
}

# States a message may be left in after a crash or failure; S2/S3 only until the
# 36-hour cleanups (docs/queue-format.md "Cleanup (36 h = 129600 s)") remove them.
LEFTOVER_STATES = (S2, S3)
LEFTOVER_AGE = 129600

# control/queuelifetime when absent (a week): once a message is older, qmail-send turns
# its next deferrals into failures and bounces them (docs/qmail-send.md "Scheduling and retries").
DEFAULT_QUEUELIFETIME = 604800

# Log-backend records (docs/architecture.md "Queue backends") and the move each one records.
RECORD_TRANSITIONS = {
    "ENVELOPE": (S2, S4),
    "PREPROCESSED": (S4, S5),
    "START": (S5, S5),
    "DELIVERY": (S5, S5),
    "BOUNCE-NOTE": (S5, S5),
    "REPLACEMENT": (S5, S5),
    "FINISH": (S5, S2),
}

# qmail-send log events (docs/qmail-send.md "Log (fd 0, unbuffered, one line per event)") and the state each one shows or moves to.
LOG_EVENT_TRANSITIONS = {
    "new msg": (S4, S4),          # preprocessing begins: the message was queued
    "info msg": (S4, S4),         # info written, still before todo is cleaned
    "starting delivery": (S5, S5),
    "delivery": (S5, S5),
    "bounce msg": (S5, S5),
    "triple bounce": (S5, S5),
    "end msg": (S5, S1),          # info unlinked (S2), then mess cleaned (S1)
    "hold msg": (S5, HELD),
    "release msg": (HELD, S5),
    "requeue msg": (S5, S5),      # a held message is released first (its own line)
    "bounce now msg": (S5, S5),   # pending recipients failed; bounce msg and end msg follow
    "delete msg": (S5, S1),       # terminal: no end msg follows (from HELD or S4 too: DELETE_FROM)
    "set aside": (S4, S4),        # qmail-send cannot record it: it stays queued (docs/qmail-send.md "Messages set aside")
}

# A delete may also end a held message, or a queued one never preprocessed (set aside,
# or deleted by qmailctl while qmail-send was down).
DELETE_FROM = (S5, HELD, S4)


def classify(present):
    """The state defined by the set of file kinds present, or None if no state fits."""
    present = set(present)
    unknown = present - set(FILES)
    if unknown:
        raise ValueError("unknown file kinds: %s" % ", ".join(sorted(unknown)))
    for state in STATES:
        rule = PRESENCE[state]
        if all(need is None or need == (kind in present) for kind, need in rule.items()):
            return state
    return None


def is_legal(before, after):
    """True when a message may move from state before to state after in one step."""
    if before == after:
        return before in SELF_MOVES or before == S1
    return (before, after) in TRANSITIONS


def path_exists(before, after):
    """True when after can be reached from before through legal moves (including none)."""
    seen, frontier = {before}, [before]
    while frontier:
        state = frontier.pop()
        for (a, b) in TRANSITIONS:
            if a == state and b not in seen:
                seen.add(b)
                frontier.append(b)
    return after in seen


def maker(before, after):
    """The program that makes a legal move, or None."""
    if before == after:
        return SELF_MOVES.get(before, (None,))[0]
    return TRANSITIONS.get((before, after), (None,))[0]
