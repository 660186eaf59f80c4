"""The reply naming the process that queued a message: 'ok TIME qp PID' (qmail-smtpd's 250,
qmail-qmqpd's and qmail-qmtpd's K). Injectors read the qp from it; qmail-audit reads it from
the peer's reply qmail-remote logged, to link a hand-off to the message the peer queued."""


def qp_of(answer):
    """The queueing process's pid from 'Kok TIME qp PID', or None."""
    _, sep, rest = answer.rpartition(b" qp ")
    return int(rest) if sep and rest.isdigit() else None
