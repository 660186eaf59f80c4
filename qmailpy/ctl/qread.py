"""What qmail-qread and qmail-qstat print (docs/queue-format.md "qmail-qread and qmail-qstat"), from backend MessageViews and counts."""
from qmailpy.envelope import date822


def printable(data):
    """Bytes outside 32..126 become '_', as qmail-qread prints them."""
    return bytes(ch if 32 <= ch <= 126 else 95 for ch in data)


def message_lines(view):
    """The lines (bytes, LF-terminated) qmail-qread prints for one MessageView."""
    if view.error is not None:
        return [b"warning: trouble with #%d: %s\n" % (view.n, view.error.encode("utf-8", "replace"))]
    date = date822(view.birth)[:-len(b" -0000")]
    head = b"%s GMT  #%d  %d  <%s> %s\n" % (
        date, view.n, view.size, printable(view.sender), b" bouncing" if view.bouncing else b"")
    lines = [head]
    for channel, records in ((b"local", view.local), (b"remote", view.remote)):
        for record in records:
            lines.append(b"%s\t%s\t%s\n" % (b"  done" if record.done else b"", channel,
                                          printable(record.address)))
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
        return backend.list_messages, backend.counts
    from qmailpy.backends import dirlist
    queue = os.path.join(home, "queue")
    return (lambda: dirlist.list_messages(queue)), (lambda: dirlist.counts(queue))
