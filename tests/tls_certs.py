"""A throw-away CA and certificates made with the `openssl` program, for the TLS tests.

The openssl program comes with the OpenSSL that Python's ssl module uses (bin/test
installs it where it may, and the CVE-2011-0411 and TLS-version tests drive
`openssl s_client` anyway), and three commands make what the tests need, so the
`trustme` package (and the `cryptography` wheel under it) is not a dependency.

make_certs(directory, dns, ips) -> Certs with: ca (the CA's PEM, a client's cafile),
server_pem (the server certificate, for the names given, then its key in one file,
as control/servercert.pem holds them), client_context(), server_context() and
self_signed_context() (a certificate for the same names that no CA vouches for).
"""
import os
import shutil
import ssl
import subprocess

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]


class Certs:
    def __init__(self, directory):
        self.dir = directory
        self.ca = os.path.join(directory, "ca.pem")
        self.server_pem = os.path.join(directory, "servercert.pem")

    def server_bytes(self):
        with open(self.server_pem, "rb") as f:
            return f.read()

    def client_context(self):
        """A client context that trusts only the test CA (and checks the host name)."""
        return ssl.create_default_context(cafile=self.ca)

    def server_context(self):
        """A server context with the CA-signed certificate."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.server_pem)
        return ctx

    def self_signed_context(self):
        """A server context with a self-signed certificate for the same names."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(self.dir, "self.crt"), os.path.join(self.dir, "self.key"))
        return ctx


def make_certs(directory, dns=("localhost",), ips=("127.0.0.1",)):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl program is not installed")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    names = ",".join(["DNS:" + n for n in dns] + ["IP:" + ip for ip in ips])
    subject = "/CN=" + (dns[0] if dns else ips[0])
    openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.pem",
            "-subj", "/CN=qmailpy test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *_EC, "-keyout", "server.key", "-out", "server.csr", "-subj", subject)
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n" % names)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt")
    openssl("req", "-x509", *_EC, "-keyout", "self.key", "-out", "self.crt", "-subj", subject,
            "-addext", "subjectAltName=" + names)
    certs = Certs(directory)
    with open(certs.server_pem, "wb") as out:
        for name in ("server.crt", "server.key"):
            with open(os.path.join(directory, name), "rb") as f:
                out.write(f.read())
    return certs
