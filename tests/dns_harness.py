"""dnsmasq as the test DNS server on 127.0.0.1, reached through control/dnsresolvers.

Dnsmasq(records) runs `dnsmasq --no-daemon` on a free port with only its own
options (no /etc/dnsmasq.conf, no resolv.conf, no /etc/hosts), answering for the
`.test` zone (names it does not know there are NXDOMAIN). records are dnsmasq
options without their `--`: `mx-host=x.test,mx.x.test,10`, `host-record=...`,
`txt-record=...`. It is ready once it answers a query (waited for on its socket);
close() ends it. Silent(): a UDP socket on 127.0.0.1 that never answers.

DNSServer(zone, servfail): a dnspython server in a thread on 127.0.0.1, answering from
zone ({name: {type: [rdata text]}}, SERVFAIL for the names in servfail); lookup() is
qmail-remote's lookup through a resolver pointed at it.
"""
import os
import pwd
import shutil
import socket
import subprocess
import threading
import time

import dns.message
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset
import pytest

from qmailpy.remote import dns as rdns

WAIT = 30


def free_port():
    """A port free for both UDP and TCP on 127.0.0.1 (dnsmasq listens on both)."""
    while True:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        port = u.getsockname()[1]
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            t.close()
            u.close()


def txt_strings(value):
    """A TXT value as dnsmasq's comma-separated strings of at most 255 bytes."""
    return ",".join(value[i:i + 255] for i in range(0, len(value), 255))


class Dnsmasq:
    def __init__(self, records):
        binary = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq")
                                              else None)
        if binary is None:
            pytest.skip("dnsmasq is not installed (bin/test installs it)")
        self.port = free_port()
        argv = [binary, "--no-daemon", "--conf-file=/dev/null", "--port=%d" % self.port,
                "--listen-address=127.0.0.1", "--bind-interfaces", "--no-resolv", "--no-hosts",
                "--pid-file=", "--local=/test/", "--log-facility=-"]
        if os.geteuid() == 0:
            argv.append("--user=%s" % pwd.getpwuid(65534).pw_name)
        argv += ["--" + r for r in records]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self):
        import dns.exception
        import dns.message
        import dns.query
        deadline = time.monotonic() + WAIT
        query = dns.message.make_query("ready.test.", "A")
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("dnsmasq exited: %r" % self.proc.stderr.read())
            try:
                dns.query.udp(query, "127.0.0.1", port=self.port, timeout=0.5)
                return
            except (OSError, dns.exception.Timeout):
                if time.monotonic() > deadline:
                    raise
                # not yet bound: ICMP refusal comes back at once, so wait on the process a little
                try:
                    self.proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    pass

    def control_line(self):
        return "127.0.0.1:%d\n" % self.port

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(WAIT)
        self.proc.stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Silent:
    """A DNS server address that takes queries and never answers."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def control_line(self):
        return "127.0.0.1:%d\n" % self.port

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DNSServer:
    def __init__(self, zone, servfail):
        self.zone, self.servfail = zone, servfail
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            query = dns.message.from_wire(data)
            response = dns.message.make_response(query)
            question = query.question[0]
            name = question.name.to_text()
            rdtype = dns.rdatatype.to_text(question.rdtype)
            if name in self.servfail:
                response.set_rcode(dns.rcode.SERVFAIL)
            elif name not in self.zone:
                response.set_rcode(dns.rcode.NXDOMAIN)
            elif rdtype in self.zone[name]:
                response.answer.append(dns.rrset.from_text_list(name, 300, "IN", rdtype,
                                                                self.zone[name][rdtype]))
            self.sock.sendto(response.to_wire(), peer)

    def lookup(self):
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = ["127.0.0.1"]
        resolver.port = self.port
        resolver.lifetime = 5
        return rdns.resolver_lookup(resolver)

    def close(self):
        self.sock.close()
