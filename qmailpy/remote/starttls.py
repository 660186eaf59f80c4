"""qmail-remote's STARTTLS negotiation (docs/delivery.md "STARTTLS"): the command, the
handshake and the certificate's names, on a smtp.Session after its first EHLO.

remote/tls.py holds the policy and the TLS context, smtp.Connection.starttls the
handshake on the socket. Every failure here is a TryNext (the next address may do),
raised after a QUIT: nothing but EHLO, STARTTLS and QUIT is sent in clear to a host
that fails them. Imported only when the peer offers STARTTLS or the policy requires
it, so a run to a peer without it does not pay for ssl.
"""
from qmailpy.remote import tls
from qmailpy.remote.smtp import Deadline, Dropped, TryNext


def failed(session, why, said=b""):
    """TryNext, after a QUIT that nothing may stop: its Z record and the reason alone."""
    session.send_quit()
    return TryNext(b"ZConnected to " + session.partner + b" but " + why + b". (#4.7.5)\n" + said,
                   why)


def _reason(error):
    return str(error).encode("utf-8", "replace")


def negotiate(session, ext, policy):
    """The peer's extensions from its EHLO inside TLS. ext: those of its first EHLO;
    policy: a remote.tls.Policy, None when TLS is opportunistic."""
    conn = session.conn
    if b"STARTTLS" not in ext:
        raise failed(session, b"it does not offer STARTTLS, which control/tlsdestinations "
                              b"requires")
    conn.write(b"STARTTLS\r\n")
    if conn.reply() != 220:
        raise failed(session, b"STARTTLS was refused", conn.said())
    policy = policy or tls.Policy()
    try:
        context = tls.context(policy)
    except (OSError, ValueError) as e:      # the CA file (ssl.SSLError is an OSError)
        raise failed(session, b"its CA file cannot be used: " + _reason(e)) from None
    try:
        conn.starttls(context, policy.names[0].decode("ascii") if policy.names else None)
    except Deadline:
        raise
    except Dropped as e:
        raise failed(session, b"the TLS handshake failed: " + _reason(e)) from None
    if policy.required and not tls.names_match(conn.sock.getpeercert(), policy.names):
        raise failed(session, b"its certificate names none of " + b", ".join(policy.names))
    return session.hello()
