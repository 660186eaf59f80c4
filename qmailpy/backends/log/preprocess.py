"""The PREPROCESSED record of a queued message on the log backend, or why it cannot be one.

This is the one check that sets a message aside (docs/qmail-send.md "Messages set aside"):
qmail-send's preprocessing appends what preprocessed() returns, and `qmailctl queue list`
asks the same of every queued message, with the routing of qmail-send's control files, to
show the messages qmail-send sets aside (it keeps that only in memory; a marker on disk
would be a second statement of the fact, and could disagree after a control file changed).
"""
from qmailpy.backends.log import records as R
from qmailpy.backends.base import SetAside


def preprocessed(env, pos, size, route, now, hold=False):
    """(record bytes, {channel: [due, [(done, address)]]}) of ENVELOPE record env (at log
    position pos, body of size bytes) routed by route(); SetAside when it does not fit.
    hold: its queueing asked for a hold (qmailpy.mess.HOLD_MODE): the record is held when
    there is anything to deliver (docs/queue-format.md "Hold at queueing")."""
    channels = {}
    for rcpt in env.recipients:
        channel, address = route(rcpt)
        channels.setdefault(channel, [now, []])[1].append((False, address))
    try:
        data = R.encode_snapshot(R.PREPROCESSED, now, env.n, pos, now, env.qp, env.uid, size,
                                 env.sender, b"", (), {c: (d, r) for c, (d, r) in channels.items()},
                                 hold and bool(channels))
    except R.RecordError:
        # Queued before qmailpy.queuelimits, or rewritten beyond its allowance
        raise SetAside("%d recipients take more than a log record holds once rewritten"
                       % len(env.recipients)) from None
    return data, channels
