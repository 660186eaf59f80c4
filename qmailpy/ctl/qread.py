"""What qmail-qread and qmail-qstat print (docs/queue-format.md "qmail-qread and qmail-qstat"), from backend MessageViews and counts."""
from qmailpy.envelope import date822


def printable(data):
    """Bytes outside 32..126 become '_', as qmail-qread prints them."""
    return bytes(ch if 32 <= ch <= 126 else 95 for ch in data)


def message_lines(view):
    """The lines (bytes, LF-terminated) qmail-qread prints for one MessageView."""
    if view.error is not None:
        return [b"warning: trouble with #%d: %s\n" % (view.n, view.error.encode("utf-8", "replace"))]
    recipients = [(channel, record.done, record.address)
                  for channel, records in ((b"local", view.local), (b"remote", view.remote))
                  for record in records]
    return _lines(view.n, view.birth, view.size, view.sender, view.bouncing, recipients)


def _lines(n, birth, size, sender, bouncing, recipients):
    date = date822(birth)[:-len(b" -0000")]
    head = b"%s GMT  #%d  %d  <%s> %s\n" % (
        date, n, size, printable(sender), b" bouncing" if bouncing else b"")
    return [head] + [b"%s\t%s\t%s\n" % (b"  done" if done else b"", channel, printable(address))
                     for channel, done, address in recipients]


def record_lines(record):
    """qmail-qread's lines for a snapshot message record (qmailctl queue list). A message
    not yet preprocessed shows its recipients under the channel 'todo'; a held one
    ends its first line with ' held', one qmail-send sets aside with ' set aside: WHY'."""
    from qmailpy.snapshot_format import raw
    if record["problems"] and record["sender"] is None:
        return [b"warning: trouble with #%d: %s\n"
                % (record["n"], record["problems"][0].encode("utf-8", "replace"))]
    recipients = [(r["channel"].encode(), r["done"], raw(r["address"]))
                  for r in record["recipients"]]
    lines = _lines(record["n"], record["birth"] or 0, record["size"] or 0,
                   raw(record["sender"] or ""), record["bouncing"], recipients)
    if record.get("held"):
        lines[0] = lines[0][:-1] + b" held\n"
    if record.get("set_aside"):
        lines[0] = lines[0][:-1] + b" set aside: %s\n" % record["set_aside"].encode("utf-8", "replace")
    return lines


def qstat_lines(in_queue, not_preprocessed):
    return [b"messages in queue: %d\n" % in_queue,
            b"messages in queue but not yet preprocessed: %d\n" % not_preprocessed]


def queue_reader(home):
    """(list_messages, counts) callables for the home's configured backend."""
    import os
    from qmailpy.backends import backend_name
    if backend_name(home) == "log":
        from qmailpy.backends import open_backend
        backend = open_backend(home)

        def counts():
            # qmail-send's counters and the records after them (backends/log/counts.py),
            # as `qmailctl queue size`; without them, a full read of the log
            found = backend.current_counts()
            if found is None:
                return backend.counts()
            found = found.as_dict()
            return found["total"], found["new"]
        return backend.list_messages, counts
    from qmailpy.backends.dir import listing
    queue = os.path.join(home, "queue")
    return (lambda: listing.list_messages(queue)), (lambda: listing.counts(queue))
