"""CPU cost of one DKIM signature in qmail-remote (docs/delivery.md "DKIM signing").

    .venv/bin/python bench/dkim_sign.py [--n 200] [--size 4096]

Makes an RSA-2048 key (openssl) and an Ed25519 key in a temporary directory, then
signs a message of --size bytes --n times with each through qmail-remote's own code
(dkimkeys.load + dkimsign.sign: key file read and parsed, message canonicalised,
hashed and signed), and prints the CPU time per signature. Also prints the CPU cost
of the imports a signing qmail-remote adds (dkimpy, PyNaCl), once per process.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from qmailpy import dkimkeys  # noqa: E402
from qmailpy.ctl import dkim as keygen  # noqa: E402
from qmailpy.remote import dkimsign  # noqa: E402


def message(size):
    head = (b"From: Joe <joe@example.test>\nTo: ann@x.test\nSubject: bench\n"
            b"Date: 27 Nov 2026 03:00:00 -0000\nMessage-ID: <1@example.test>\n\n")
    line = b"The quick brown fox jumps over the lazy dog, 0123456789 times.\n"
    return head + line * max(1, (size - len(head)) // len(line))


def per_signature(path, data, n):
    entry = dkimkeys.Entry(b"example.test", b"sel", os.fsencode(path))
    dkimsign.sign(data, [entry])                # imports done, caches warm
    start = time.process_time()
    for _ in range(n):
        dkimsign.sign(data, [entry])
    return (time.process_time() - start) / n


def import_cost():
    code = ("import time; t = time.process_time(); import dkim, nacl.signing; "
            "print(time.process_time() - t)")
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                                 text=True).stdout) for _ in range(5)]
    return min(runs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    data = message(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        rsa = os.path.join(tmp, "rsa.private")
        ed = os.path.join(tmp, "ed.private")
        for path, (private, _) in ((rsa, keygen.rsa_key()), (ed, keygen.ed25519_key())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, private)
            os.close(fd)
        print("message: %d bytes, %d signatures each" % (len(data), args.n))
        for name, path in (("RSA-2048 (rsa-sha256)", rsa), ("Ed25519 (ed25519-sha256)", ed)):
            print("%-26s %8.2f ms CPU per signature" % (name, per_signature(path, data, args.n) * 1000))
    print("%-26s %8.2f ms CPU once per qmail-remote process that signs"
          % ("import dkimpy + PyNaCl", import_cost() * 1000))


if __name__ == "__main__":
    main()
