"""The audit's per-message grouping without Spark, for the audit tests: groups_of keys one
host's log events (and snapshot items) by message as the Spark job does.
"""
from qmailpy_audit import logparse, messages


def groups_of(events, snaps=()):
    """{n: items} of one host's log events (and snapshot items), as the Spark job keys them."""
    groups = {}
    by_d = {}
    for e in events:
        if e[3] in ("start", "result"):
            by_d.setdefault(e[5], []).append(e)
        if e[3] in logparse.MESSAGE_KINDS:
            groups.setdefault(e[4], []).append(("ev", e, e[1], e[2]))
    for evs in by_d.values():
        paired, _ = messages.pair_deliveries(evs)
        for (_h, n), item in paired:
            groups.setdefault(n, []).append(item)
    for n, item in snaps:
        groups.setdefault(n, []).append(item)
    return groups
