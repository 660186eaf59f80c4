"""qmail-audit --where KEY=VALUE: where one message is now across the fleet, and where it
has been (issue 26 point 3; qmail-audit(8) "WHERE IS IT").

KEY is sender, recipient or message-id. Queued copies come from the latest snapshot of
every host (spark/fleetqueue.py): a record matches when its envelope sender is VALUE,
one of its recipients (pending or done) is VALUE (both ignoring case), or its Message-ID
is VALUE (angle brackets optional). With --fleet and logs, the journeys (spark/fleet.py)
that pass a queued copy are given, and for sender and recipient also every journey with a
hop whose log shows that sender or a delivery to that recipient: the logs carry no
Message-ID, so a message no longer queued anywhere is found by its addresses only.
"""
KEYS = ("sender", "recipient", "message-id")


def parse(text):
    """(key, value) of KEY=VALUE; ValueError naming what is wrong."""
    key, sep, value = text.partition("=")
    key = key.strip().lower()
    if not sep or key not in KEYS:
        raise ValueError("--where wants KEY=VALUE with KEY one of %s, got %r"
                         % (", ".join(KEYS), text))
    if key == "message-id":
        value = _bare_id(value)
        if not value:
            raise ValueError("--where message-id= wants a Message-ID")
    elif key == "recipient" and not value.strip():
        raise ValueError("--where recipient= wants an address")
    return key, value.strip()


def _bare_id(value):
    value = (value or "").strip()
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    return value


def _sender(value):
    """The envelope sender as the queue holds it: the null sender <> is empty."""
    return "" if value in ("", "<>") else value.lower()


def matcher(key, value):
    """A predicate over snapshot message records (picklable: it runs on Spark workers)."""
    if key == "sender":
        wanted = _sender(value)
        return lambda rec: rec.get("sender") is not None and rec["sender"].lower() == wanted
    if key == "recipient":
        wanted = value.lower()
        return lambda rec: any(r["address"].lower() == wanted for r in rec["recipients"])
    wanted = _bare_id(value)
    return lambda rec: _bare_id(rec.get("message_id")) == wanted


def _occurrence_of(fleet, queued):
    """The fleet's occurrence of a queued copy: the same host and number, not ended,
    the latest born (a number is reused once its message is gone)."""
    found = [o for o in fleet.occs.values()
             if o.host == queued["host"] and o.n == queued["n"] and not o.ended]
    return max(found, key=lambda o: o.birth) if found else None


def journeys(fleet, key, value, queued):
    """The fleet's journeys that pass a queued match or, by address, a logged one."""
    keys = set()
    for q in queued:
        occ = _occurrence_of(fleet, q)
        if occ is not None:
            keys.add(occ.key)
    if key == "sender":
        wanted = _sender(value)
        keys |= {o.key for o in fleet.occs.values()
                 if o.sender is not None and o.sender.lower() == wanted}
    elif key == "recipient":
        wanted = value.lower()
        keys |= {o.key for o in fleet.occs.values()
                 if any(r.lower() == wanted for r in o.recipients)}
    out = []
    for j in fleet.journeys:
        if any((h["host"], h["n"], h["queued"]) in keys for h in j["hops"]):
            out.append(j)
    return out


def answer(key, value, queue, fleet=None):
    """The JSON object --where prints."""
    queued = queue.find(matcher(key, value))
    return {
        "query": {key: value},
        "snapshots": dict(sorted(queue.taken.items())),
        "queued": queued,
        "journeys": None if fleet is None else journeys(fleet, key, value, queued),
    }


def found(result):
    return bool(result["queued"] or result["journeys"])
