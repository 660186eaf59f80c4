"""tcp-env [-rR] [-t timeout] program [arg ...]: run program with the TCP environment of fd 0 (tcp-env(1)).

As qmail's: unless PROTO is already TCP (or qmailpy's TCP6), set PROTO and
TCPLOCALIP/PORT, TCPREMOTEIP/PORT (and TCP6* for an IPv6 client, as
qmail-smtpd-listen does) from the socket on fd 0, TCPLOCALHOST and
TCPREMOTEHOST from PTR lookups through the home's resolver setup (unset when
there is no name), and with -r (the default) TCPREMOTEINFO from the client's
RFC 1413 ident service, waiting at most -t seconds (default 30); -R skips it.
Then exec program. Exit 100 for a usage error; 111 when fd 0 is not a TCP
socket or program cannot be run.
"""
import os
import socket
import sys

FATAL = "tcp-env: fatal: "
USAGE = "tcp-env: usage: tcp-env [ -rR ] [ -t timeout ] program\n"
IDENT_PORT = 113
NAMED = ("TCPLOCALHOST", "TCPREMOTEHOST", "TCPREMOTEINFO",
         "TCP6REMOTEIP", "TCP6REMOTEPORT", "TCP6LOCALIP", "TCP6LOCALPORT")


def ptr_name(resolve, ip):
    """The first PTR name of ip without its final dot, or None."""
    try:
        answer = resolve(ip)
    except Exception:       # dnspython's NXDOMAIN, NoAnswer, Timeout, NoNameservers...: no name
        return None
    for rr in answer:
        return rr.to_text().rstrip(".")
    return None


def ident(local, remote, timeout):
    """The user name the client's ident service (RFC 1413, port 113) gives for this connection, or None."""
    import time
    deadline = time.monotonic() + timeout
    family = socket.AF_INET6 if ":" in remote[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.bind((local[0], 0))
            s.connect((remote[0], IDENT_PORT))
            s.sendall(b"%d , %d\r\n" % (remote[1], local[1]))
            reply = b""
            while b"\n" not in reply and len(reply) < 1000:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(1000)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return None
    fields = reply.split(b"\n", 1)[0].rstrip(b"\r").split(b":", 3)
    if len(fields) < 4 or fields[1].strip().upper() != b"USERID":
        return None
    return os.fsdecode(fields[3].strip()) or None


def set_environment(environ, sock, want_ident, timeout, resolve):
    from qmailpy.smtpd.tcpenv import unmapped
    local, remote = sock.getsockname(), sock.getpeername()
    local_ip, remote_ip = unmapped(local[0]), unmapped(remote[0])
    for name in NAMED:
        environ.pop(name, None)
    environ["PROTO"] = "TCP6" if ":" in remote_ip else "TCP"
    environ["TCPLOCALIP"], environ["TCPLOCALPORT"] = local_ip, str(local[1])
    environ["TCPREMOTEIP"], environ["TCPREMOTEPORT"] = remote_ip, str(remote[1])
    if ":" in remote_ip:
        environ["TCP6LOCALIP"], environ["TCP6LOCALPORT"] = local_ip, str(local[1])
        environ["TCP6REMOTEIP"], environ["TCP6REMOTEPORT"] = remote_ip, str(remote[1])
    for name, ip in (("TCPLOCALHOST", local_ip), ("TCPREMOTEHOST", remote_ip)):
        host = ptr_name(resolve, ip)
        if host is not None:
            environ[name] = host
    if want_ident:
        info = ident(local, remote, timeout)
        if info is not None:
            environ["TCPREMOTEINFO"] = info


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from qmailpy.util.sgetopt import GetoptError, sgetopt
    try:
        opts, program = sgetopt(argv, "rRt:")
    except GetoptError:
        sys.stderr.write(USAGE)
        return 100
    want_ident, timeout = True, 30
    for letter, value in opts:
        if letter in "rR":
            want_ident = letter == "r"
        elif letter == "t":
            digits = len(value) - len(value.lstrip("0123456789"))
            timeout = int(value[:digits]) if digits else 0
    if not program:
        sys.stderr.write(USAGE)
        return 100
    if os.environ.get("PROTO") not in ("TCP", "TCP6"):
        try:
            sock = socket.socket(fileno=0)
        except OSError:
            sys.stderr.write(FATAL + "standard input is not a socket\n")
            return 111
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                sys.stderr.write(FATAL + "standard input is not a TCP socket\n")
                return 111
            set_environment(os.environ, sock, want_ident, max(1, timeout), _resolver())
        except OSError as e:
            from qmailpy.local.errors import error_str
            sys.stderr.write("%sunable to read the connection's addresses: %s\n" % (FATAL, error_str(e).decode()))
            return 111
        finally:
            sock.detach()
    import signal
    # qmail's sig_pipedefault(); SIGXFSZ too: the interpreter ignored both, and an ignored
    # signal stays ignored across exec
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execvp(program[0], program)
    except OSError as e:
        from qmailpy.local.errors import error_str
        sys.stderr.write("%sunable to run %s: %s\n" % (FATAL, program[0], error_str(e).decode()))
        return 111


def _resolver():
    """resolve(ip) through the home's resolver setup (qmailpy.resolver), or a function that
    finds nothing when the setup cannot be read."""
    from qmailpy import resolver
    from qmailpy.home import ControlError, qmail_home
    try:
        res = resolver.build(resolver.settings(qmail_home()))
    except ControlError as e:
        sys.stderr.write("tcp-env: warning: %s; no host names\n" % e)
        return lambda ip: ()
    except Exception as e:      # dnspython's NoResolverConfiguration: no /etc/resolv.conf to use
        sys.stderr.write("tcp-env: warning: no DNS resolver (%s); no host names\n" % e)
        return lambda ip: ()
    return res.resolve_address


if __name__ == "__main__":
    sys.exit(main())
