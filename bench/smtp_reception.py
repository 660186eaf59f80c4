#!/usr/bin/env python3
"""SMTP reception: C concurrent clients send N messages to qmail-smtpd-listen.

Every message is accepted by qmail-smtpd and queued by qmail-queue's code in a
forked child (fsync'd, linked into todo/) before its "250 ok"; no qmail-send
runs, so the messages stay in todo/ and are counted there at the end.

Prints: messages/s until all are queued; the per-connection cost of starting a
qmail-smtpd session (connect -> 220 greeting -> QUIT -> 221) through the
listener (a fork), and, for comparison, of starting the qmail-smtpd program as
a new process per connection (what tcpserver or systemd Accept=yes do).

With --tls the home gets a self-signed control/servercert.pem (made by the openssl
program) and the same listener is measured twice in one run: N messages in clear, then N
more with STARTTLS on every connection; it also prints the cost of one STARTTLS
(the command, 220 and the TLS handshake, client and server on this machine).

With --authcheck, N more messages go, in the same run, to a second listener on a home with
control/authcheck (SPF, DKIM and DMARC checks, docs/submission.md "Sender authentication"):
dnsmasq (tests/dns_harness.py) serves the sender domain's SPF and DMARC records and a DKIM key,
and every message carries an RSA-2048 DKIM signature, so each one costs an SPF check, a DKIM
verification and a DMARC evaluation, all passing (checked on one queued message).

With --rspamd, rspamd from Debian starts with the tests' configuration (tests/rspamd_harness.py)
and N more messages go to the first listener through rspamd's milter proxy (control/milters,
docs/milter.md), in the same run: each session spools its message, rspamd scans it and
adds its headers, and the edited message is queued. --milter-noop does the same through
the tests' milter (tests/milter_peer.py, a thread of this process) that continues every
step: the cost of qmail-smtpd's milter client (spool, protocol) without a scan.

With --qmqpd, qmail-qmqpd runs too and every session hands its message to it, as on a
server started with qmailctl start.

Usage: .venv/bin/python bench/smtp_reception.py [-c CLIENTS] [-n MESSAGES]
                                               [-m MESSAGES_PER_CONNECTION] [-s BODY_BYTES] [--tls]
                                               [--qmqpd] [--rspamd] [--milter-noop] [--authcheck]
"""
import argparse
import multiprocessing
import os
import pwd
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.dirname(os.path.abspath(sys.executable))


def make_home():
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([os.path.join(BIN, "qmailctl"), "init", "--home", home, "--me", "bench.example",
                    "--user", user], check=True, stdout=subprocess.DEVNULL)
    return base, home


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def replies(self, count):
        """Read `count` final reply lines; return the last one."""
        last = None
        while count:
            while b"\n" not in self.buf:
                data = self.sock.recv(65536)
                if not data:
                    raise EOFError(self.buf)
                self.buf += data
            line, _, self.buf = self.buf.partition(b"\n")
            if line[3:4] == b" ":
                count -= 1
                last = line
        return last


def make_cert(home):
    """A self-signed certificate for 127.0.0.1 as control/servercert.pem; its path."""
    pem = os.path.join(home, "control", "servercert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", pem + ".key", "-out", pem + ".crt", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(pem, "wb") as out:
        for part in (".crt", ".key"):
            with open(pem + part, "rb") as f:
                out.write(f.read())
    os.chmod(pem, 0o644)            # read by qmaild when the bench runs as root
    return pem + ".crt"


def client_context(cafile):
    return ssl.create_default_context(cafile=cafile) if cafile else None


def starttls(c, context):
    """EHLO, STARTTLS and the handshake on a greeted connection."""
    c.sock.sendall(b"EHLO bench.client\r\nSTARTTLS\r\n")
    c.replies(2)
    c.sock = context.wrap_socket(c.sock, server_hostname="127.0.0.1")


def client(port, count, per_conn, body, results, cafile=None, sender=b"sender@bench.client"):
    context = client_context(cafile)
    sent = 0
    failures = 0
    while sent < count:
        c = Conn(port)
        c.replies(1)
        if context is not None:
            starttls(c, context)
        c.sock.sendall(b"HELO bench.client\r\n")
        c.replies(1)
        for _ in range(min(per_conn, count - sent)):
            c.sock.sendall(b"MAIL FROM:<" + sender + b">\r\nRCPT TO:<rcpt@bench.example>\r\n"
                           b"DATA\r\n")
            if c.replies(3) != b"354 go ahead\r":
                failures += 1
                break
            c.sock.sendall(body)
            if not c.replies(1).startswith(b"250 ok "):
                failures += 1
            sent += 1
        c.sock.sendall(b"QUIT\r\n")
        c.replies(1)
        c.sock.close()
    results.put((sent, failures))


def startup_cost(port, rounds):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        c = Conn(port)
        c.replies(1)
        t1 = time.perf_counter()
        c.sock.sendall(b"QUIT\r\n")
        c.replies(1)
        c.sock.close()
        times.append(t1 - t0)
    return statistics.median(times)


def handshake_cost(port, rounds, cafile):
    """Median seconds of STARTTLS -> 220 -> TLS handshake done, on connections already greeted."""
    context = client_context(cafile)
    times = []
    for _ in range(rounds):
        c = Conn(port)
        c.replies(1)
        c.sock.sendall(b"EHLO bench.client\r\n")
        c.replies(1)
        t0 = time.perf_counter()
        c.sock.sendall(b"STARTTLS\r\n")
        c.replies(1)
        c.sock = context.wrap_socket(c.sock, server_hostname="127.0.0.1")
        times.append(time.perf_counter() - t0)
        c.sock.sendall(b"QUIT\r\n")
        c.replies(1)
        c.sock.close()
    return statistics.median(times)


def run_clients(port, args, body, cafile=None, sender=b"sender@bench.client"):
    """(messages sent, failures, seconds) for args.messages over args.clients connections at once."""
    share = [args.messages // args.clients + (i < args.messages % args.clients)
             for i in range(args.clients)]
    results = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=client, args=(port, k, args.per_connection, body,
                                                          results, cafile, sender)) for k in share]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    totals = [results.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - t0
    return sum(t[0] for t in totals), sum(t[1] for t in totals), elapsed


def exec_startup_cost(home, rounds):
    env = dict(os.environ, QMAILHOME=home, PROTO="TCP", TCPREMOTEIP="127.0.0.1",
               TCPLOCALIP="127.0.0.1")
    times = []
    for _ in range(rounds):
        a, b = socket.socketpair()
        t0 = time.perf_counter()
        proc = subprocess.Popen([os.path.join(BIN, "qmail-smtpd")], stdin=b, stdout=b, env=env)
        b.close()
        greeting = a.recv(1000)
        t1 = time.perf_counter()
        assert greeting.startswith(b"220 "), greeting
        a.sendall(b"QUIT\r\n")
        a.recv(1000)
        a.close()
        proc.wait()
        times.append(t1 - t0)
    return statistics.median(times)


AUTH_SENDER = b"sender@bench.test"


def start_listener(home):
    """qmail-smtpd-listen on a free port of 127.0.0.1: (process, port)."""
    listener = subprocess.Popen([os.path.join(BIN, "qmail-smtpd-listen"), "-c", "100", "-s", "100",
                                 "127.0.0.1:0"], stderr=subprocess.PIPE,
                                env=dict(os.environ, QMAILHOME=home))
    line = listener.stderr.readline()
    return listener, int(re.search(rb":(\d+)\n", line).group(1))


def stop(proc):
    proc.terminate()
    proc.wait()
    proc.stderr.close()


def write_control(home, name, text):
    path = os.path.join(home, "control", name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)           # read by qmaild when the bench runs as root


def authcheck_setup(home, body):
    """dnsmasq serving bench.test's SPF, DMARC and DKIM key, the checks on in home; (the
    dnsmasq, the message DKIM-signed)."""
    import base64
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from dns_harness import Dnsmasq, txt_strings

    from qmailpy import dkimkeys
    from qmailpy.ctl import dkim as keygen
    from qmailpy.remote import dkimsign
    private, public = keygen.rsa_key()
    key = os.path.join(home, "bench-dkim.key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, private)
    os.close(fd)
    message = body[:-3].replace(b"bench.client", b"bench.test")
    signature = dkimsign.sign(message, [dkimkeys.Entry(b"bench.test", b"b", os.fsencode(key))])
    signed = signature.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n") + message + b".\r\n"
    records = [("bench.test", "v=spf1 ip4:127.0.0.1 -all"),
               ("_dmarc.bench.test", "v=DMARC1; p=reject"),
               ("b._domainkey.bench.test", "v=DKIM1; k=rsa; p=" + base64.b64encode(public).decode())]
    dns = Dnsmasq(["txt-record=%s,%s" % (n, txt_strings(v)) for n, v in records])
    write_control(home, "dnsresolvers", dns.control_line())
    write_control(home, "authcheck", "")
    return dns, signed


def results_header(home):
    """The Authentication-Results field of one queued message of the checked run."""
    mess = os.path.join(home, "queue", "mess")
    for root, _, files in os.walk(mess):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                header = f.read().split(b"\n\n")[0].replace(b"\n\t", b" ")
            for line in header.split(b"\n"):
                if line.startswith(b"Authentication-Results:"):
                    return line.decode()
    return None


TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


def through_milter(home, port, args, body, line):
    """run_clients with control/milters holding line (removed after)."""
    milters = os.path.join(home, "control", "milters")
    with open(milters, "w") as f:
        f.write(line)
    os.chmod(milters, 0o644)        # read by qmaild when the bench runs as root
    try:
        return run_clients(port, args, body)
    finally:
        os.unlink(milters)


def start_rspamd(base):
    """rspamd with its milter proxy on a free port (tests/rspamd_harness.py), or exit."""
    sys.path.insert(0, TESTS)
    from rspamd_harness import Rspamd, Unavailable
    directory = os.path.join(base, "rspamd")
    os.mkdir(directory)
    try:
        return Rspamd(directory)
    except Unavailable as e:
        raise SystemExit("bench: %s" % e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-c", "--clients", type=int, default=4)
    ap.add_argument("-n", "--messages", type=int, default=2000)
    ap.add_argument("-m", "--per-connection", type=int, default=1)
    ap.add_argument("-s", "--size", type=int, default=2000, help="body bytes per message")
    ap.add_argument("--qmqpd", action="store_true",
                    help="run qmail-qmqpd too, so that sessions hand their messages to it (as under"
                         " qmailctl start) instead of forking qmail-queue's code")
    ap.add_argument("--authcheck", action="store_true",
                    help="measure again with the SPF, DKIM and DMARC checks on, in the same run")
    ap.add_argument("--tls", action="store_true",
                    help="measure again with STARTTLS on every connection, in the same run")
    ap.add_argument("--rspamd", action="store_true",
                    help="measure again through rspamd's milter, in the same run")
    ap.add_argument("--milter-noop", action="store_true",
                    help="measure again through the tests' milter that continues every step")
    args = ap.parse_args()
    base, home = make_home()
    rspamd = start_rspamd(base) if args.rspamd else None
    cafile = make_cert(home) if args.tls else None
    body = (b"From: sender@bench.client\r\nTo: rcpt@bench.example\r\nSubject: bench\r\n\r\n"
            + (b"x" * 78 + b"\r\n") * max(1, args.size // 80) + b".\r\n")
    qmqpd = None
    if args.qmqpd:
        qmqpd = subprocess.Popen([os.path.join(BIN, "qmail-qmqpd")], stderr=subprocess.PIPE,
                                 env=dict(os.environ, QMAILHOME=home))
        if b"listening on" not in qmqpd.stderr.readline():
            raise SystemExit("qmail-qmqpd did not start")
    listener, port = start_listener(home)
    dns = None
    try:
        sent, failures, elapsed = run_clients(port, args, body)
        if args.tls:
            tls_sent, tls_failures, tls_elapsed = run_clients(port, args, body, cafile)
            failures += tls_failures
            tls_cost = handshake_cost(port, 100, cafile)
        if args.authcheck:
            dns, signed = authcheck_setup(home, body)
            checked, checked_port = start_listener(home)     # preloads the checks' libraries
            try:
                ac_sent, ac_failures, ac_elapsed = run_clients(checked_port, args, signed,
                                                               sender=AUTH_SENDER)
            finally:
                stop(checked)
            failures += ac_failures
            results = results_header(home)
            os.unlink(os.path.join(home, "control", "authcheck"))
        if args.milter_noop:
            sys.path.insert(0, TESTS)
            from milter_peer import MilterPeer
            with MilterPeer() as peer:
                noop_sent, noop_failures, noop_elapsed = through_milter(home, port, args, body,
                                                                        peer.control_line())
            failures += noop_failures
        if rspamd is not None:
            milter_sent, milter_failures, milter_elapsed = through_milter(
                home, port, args, body, "inet:127.0.0.1:%d\n" % rspamd.port)
            failures += milter_failures
        queued = len(os.listdir(os.path.join(home, "queue", "todo")))
        fork_cost = startup_cost(port, 200)
        exec_cost = exec_startup_cost(home, 20)
    finally:
        stop(listener)
        if dns is not None:
            dns.close()
        if qmqpd is not None:
            qmqpd.terminate()
            qmqpd.wait()
            qmqpd.stderr.close()
        if rspamd is not None:
            rspamd.stop()
        shutil.rmtree(base, ignore_errors=True)
    print("smtp reception: %d clients, %d messages (%d per connection), %d body bytes"
          % (args.clients, args.messages, args.per_connection, len(body)))
    print("  queued %d (in todo/), failures %d, %.2f s" % (queued, failures, elapsed))
    print("  %.0f messages/s" % (sent / elapsed))
    if args.tls:
        print("  with STARTTLS on every connection: %.0f messages/s (%.2f s)"
              % (tls_sent / tls_elapsed, tls_elapsed))
        print("  one STARTTLS (command, 220, handshake): %.2f ms median" % (tls_cost * 1000))
    if args.authcheck:
        print("  with SPF, DKIM (RSA-2048) and DMARC checks: %.0f messages/s (%.2f s)"
              % (ac_sent / ac_elapsed, ac_elapsed))
        print("  one of them: %s" % results)
    if args.milter_noop:
        print("  through a milter that continues every step: %.0f messages/s (%.2f s)"
              % (noop_sent / noop_elapsed, noop_elapsed))
    if rspamd is not None:
        print("  through rspamd's milter: %.0f messages/s (%.2f s)"
              % (milter_sent / milter_elapsed, milter_elapsed))
    print("  session start via listener fork: %.2f ms median (connect -> 220)" % (fork_cost * 1000))
    print("  session start via exec of qmail-smtpd: %.2f ms median (for comparison)"
          % (exec_cost * 1000))
    expected = args.messages * (1 + args.tls + args.authcheck + args.rspamd
                                 + args.milter_noop)
    return 0 if failures == 0 and queued == expected else 1


if __name__ == "__main__":
    sys.exit(main())
