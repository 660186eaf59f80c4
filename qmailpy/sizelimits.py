"""Message size limits (docs/submission.md "Size limits"): which control file bounds what.

As in qmail, control/databytes bounds what arrives from the network (qmail-smtpd, and
QMQP over TCP); qmail's own submissions (bounces, double bounces, forwards) never.
A local user is bounded only when the administrator writes control/localdatabytes.
Absent or 0: no limit, qmail's meaning; `qmailctl init` writes SHIPPED_DATABYTES to
control/databytes of a home that has none, so a fresh install has a limit.
"""
NETWORK_CONTROL = "databytes"
LOCAL_CONTROL = "localdatabytes"
SHIPPED_DATABYTES = 26214400        # 25 MiB (Postfix ships 10 MB, Exchange Online 25 MB)


def read_limit(home, control):
    """The largest message in bytes control (NETWORK_CONTROL or LOCAL_CONTROL) allows;
    0: no limit. ControlError (qmailpy.home) when the file cannot be read."""
    from qmailpy.home import control_int
    return control_int(home, control, 0)
