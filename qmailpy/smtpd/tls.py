"""STARTTLS for qmail-smtpd (RFC 3207), as the qmail TLS patch names its files.

The certificate and its private key are one PEM file, control/servercert.pem.
STARTTLS is offered only when that file is readable and the connection on fd 0
is a socket (under tcpserver, the listener or systemd's Accept=yes it is; a
pipe is not). ssl is imported only when a session starts TLS, so a plain
session pays nothing for it.
"""
import os
import stat

CERT = "servercert.pem"
# How long a client has for the TLS handshake after "220 ready for tls"
# (control/timeoutsmtpdtls); the session deadline still applies.
DEFAULT_HANDSHAKE_TIMEOUT = 60


class TlsUnavailable(Exception):
    """The certificate cannot be used: STARTTLS is answered 454."""


def handshake_timeout(home):
    """control/timeoutsmtpdtls: seconds for the handshake after STARTTLS, at least 1."""
    from qmailpy.home import control_int
    return control_int(home, "timeoutsmtpdtls", DEFAULT_HANDSHAKE_TIMEOUT, low=1)


def cert_path(home):
    return os.path.join(home, "control", CERT)


def can_offer(home, fd):
    """True when STARTTLS may be advertised: fd is a socket and the certificate is readable."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
    except OSError:
        return False
    return os.access(cert_path(home), os.R_OK)


def preload():
    """Import ssl and let OpenSSL initialise itself (its first context costs ~6 ms), so that
    sessions forked afterwards (qmail-smtpd-listen) pay for neither."""
    import ssl
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)


# cert path -> (what os.stat said of it, its context): a session worker serves many
# sessions, and making the context (reading and checking the key) costs 1-2 ms each
_contexts = {}


def server_context(home):
    """The ssl module's server defaults, TLS 1.2 at least, with control/servercert.pem;
    the one made for an earlier session while the file has not changed."""
    import ssl
    path = cert_path(home)
    try:
        st = os.stat(path)
    except OSError as e:
        raise TlsUnavailable(str(e)) from e
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _contexts.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    # the defaults create_default_context() sets, without loading the system's CA
    # certificates (tens of ms): client certificates are not asked for
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # TLS 1.3 session tickets stay on although a session process's ticket key dies with
    # it: they answer the client's Finished at once, and without them the client's
    # first command waits for our delayed ACK (~40 ms, bench/smtp_reception.py --tls).
    try:
        context.load_cert_chain(path)
    except (OSError, ssl.SSLError) as e:
        raise TlsUnavailable(str(e)) from e
    _contexts[path] = (key, context)
    return context


def handshake(context, fd, timeout):
    """The TLS connection over the socket on fd after a server handshake, or None when
    the client sent no valid handshake within timeout seconds (or went away)."""
    import socket
    sock = socket.socket(fileno=os.dup(fd))
    try:
        # Replies are already written in whole batches; without this a reply waits behind
        # the client's delayed ACK of the previous TLS record (~40 ms a command).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:                     # not TCP (a socket pair in tests)
        pass
    conn = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    conn.settimeout(timeout)
    try:
        conn.do_handshake()
    except (OSError, ValueError):       # ssl.SSLError and socket timeouts are OSErrors
        conn.close()
        return None
    return conn


def protocol(conn, word):
    """The Received line's protocol for a TLS session, after the TLS patch's form:
    (TLSv1.3:TLS_AES_256_GCM_SHA384 encrypted) SMTP."""
    name, version, _ = conn.cipher()
    return b"(%s:%s encrypted) %s" % (version.encode("ascii", "replace"),
                                       name.encode("ascii", "replace"), word)
