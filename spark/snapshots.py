"""Checks on queue snapshot records (qmailpy.snapshot_format format), pure Python.

check_record() gives the findings one message record shows by itself;
observation() the item handed to the per-message transition table so the
snapshot can be compared with the log of the same host.
"""
from qmailpy import states
from qmailpy_audit.messages import RETRY_SKIP, finding, last_attempt_offset  # noqa: F401

FILE_PROBLEMS = ("split-mismatch", "inode-mismatch", "duplicate", "unknown-record",
                 "unreadable")


def check_record(rec, taken, queuelifetime, lifetime_slack):
    """Findings for one message record of a snapshot taken at `taken`."""
    host, n, state, files = rec["host"], rec["n"], rec.get("state"), rec["files"]
    birth = rec.get("birth")
    out = []
    if state is None:
        out.append(finding(host, n, birth, "files-disagree", taken,
                           "no queue state fits the files present: %s"
                           % (", ".join(sorted(files)) or "none")))
    for problem in rec["problems"]:
        if problem.split(":", 1)[0] in FILE_PROBLEMS:
            out.append(finding(host, n, birth, "files-disagree", taken, problem))
    if state in states.LEFTOVER_STATES:
        mess = files.get("mess") or {}
        since = mess.get("atime") if mess.get("atime") is not None else mess.get("mtime")
        if since is not None and taken - since > states.LEFTOVER_AGE:
            out.append(finding(host, n, birth, "stale-leftover", taken,
                               "%s leftover (%s) untouched for %.0f s, more than %d s"
                               % (state, states.DESCRIPTION[state], taken - since,
                                  states.LEFTOVER_AGE)))
    if state is not None and states.PRESENCE[state]["info"] and birth is not None:
        for channel in sorted({r["channel"] for r in rec["recipients"] if not r["done"]}):
            if channel not in RETRY_SKIP:
                continue
            due = birth + last_attempt_offset(channel, queuelifetime) + lifetime_slack
            if taken > due:
                out.append(finding(host, n, birth, "past-lifetime", taken,
                                   "%s recipients still pending %.0f s after birth; "
                                   "queuelifetime is %d s" % (channel, taken - birth,
                                                              queuelifetime)))
    return out


def observation(rec, taken):
    """((host, n), item) for the transition table of this message number."""
    pending = sum(1 for r in rec["recipients"] if not r["done"])
    return ((rec["host"], rec["n"]), ("snap", (rec.get("state"), rec.get("birth"), pending),
                                      taken, None))


def check_file(meta, errors, count):
    """Bad-input texts for one snapshot file.

    meta: its header and end records; errors: (line number, text) of lines that are
    not records; count: message records read.
    """
    bad = ["line %d: %s" % (number, text) for number, text in errors]
    headers = [r for r in meta if r["record"] == "snapshot"]
    trailers = [r for r in meta if r["record"] == "end"]
    if len(headers) != 1:
        bad.append("expected one snapshot header, found %d" % len(headers))
    if not trailers:
        bad.append("no end record: the snapshot is torn (%d messages read)" % count)
    elif trailers[-1]["messages"] != count + len(errors):
        bad.append("end record counts %d messages, file holds %d"
                   % (trailers[-1]["messages"], count + len(errors)))
    return bad
