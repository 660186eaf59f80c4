"""A throw-away CA and a server certificate for localhost / 127.0.0.1, made with `openssl`.

The `cryptography` and `trustme` packages are not installed here; the openssl
program is (it comes with the OpenSSL that Python's ssl module uses), and three
commands make what the TLS tests need. make_certs(directory) -> Certs with:
ca (the CA's PEM, for the client's cafile), server_pem (certificate then key in
one file, as control/servercert.pem holds them), and client_context().
"""
import os
import shutil
import ssl
import subprocess

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


class Certs:
    def __init__(self, directory):
        self.ca = os.path.join(directory, "ca.pem")
        self.server_pem = os.path.join(directory, "servercert.pem")

    def server_bytes(self):
        with open(self.server_pem, "rb") as f:
            return f.read()

    def client_context(self):
        """A client context that trusts only the test CA (and checks the host name)."""
        return ssl.create_default_context(cafile=self.ca)


def make_certs(directory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl program is not installed")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=qmailpy test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *_EC, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt")
    certs = Certs(directory)
    with open(certs.server_pem, "wb") as out:
        for name in ("server.crt", "server.key"):
            with open(os.path.join(directory, name), "rb") as f:
                out.write(f.read())
    return certs
