#!/usr/bin/env python3
"""What hostile SMTP clients cost the listener: memory under many idle connections and
under a flood of RCPTs.

    .venv/bin/python bench/smtp_abuse.py [--idle 500] [--rcpts 10000] [--maxrcpt N]

Starts qmail-smtpd-listen on 127.0.0.1 (a throw-away home by `qmailctl init`,
-c and -s set above --idle so that every connection gets a session although all
come from one address; --maxrcpt writes control/maxrcpt), then:

1. opens --idle connections that read the greeting and say nothing more, and
   reports the RSS of the listener and the sum of its sessions' RSS and USS
   (USS: the memory a session really adds, pages shared with the listener
   after the fork not counted);
2. in one session sends MAIL FROM and --rcpts RCPT TO commands (pipelined in
   batches), and reports the replies by code (with control/maxrcpt, the ones
   past the cap are refused) and that session's RSS/USS peak as the RCPTs
   arrive, and the listener's RSS after them. The session then QUITs; nothing
   is queued;
3. with the listener's default per-client limit (-s: half of -c), opens -c
   connections from 127.0.0.1 and counts those answered 220 and those refused
   with 421.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import psutil

from smtp_reception import BIN, make_home


def mib(n):
    return n / (1024 * 1024)


def sessions(listener):
    return [c for c in psutil.Process(listener.pid).children()]


def memory(procs):
    rss = uss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        uss += info.uss
    return rss, uss


def read_reply(sock, pending):
    while True:
        lines = pending[0].split(b"\r\n")
        for i, line in enumerate(lines[:-1]):
            if line[3:4] == b" ":
                pending[0] = b"\r\n".join(lines[i + 1:])
                return line
        data = sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        pending[0] += data


def idle_connections(port, count):
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        pending = [b""]
        read_reply(s, pending)
        socks.append(s)
    return socks


def rcpt_flood(listener, port, count, batch=100):
    s = socket.create_connection(("127.0.0.1", port))
    pending = [b""]
    read_reply(s, pending)
    s.sendall(b"HELO flood.example\r\nMAIL FROM:<a@flood.example>\r\n")
    read_reply(s, pending)
    read_reply(s, pending)
    session = [p for p in sessions(listener)][-1]
    codes = {}
    peak_rss = peak_uss = 0
    for start in range(0, count, batch):
        n = min(batch, count - start)
        s.sendall(b"".join(b"RCPT TO:<r%d@bench.example>\r\n" % i for i in range(start, start + n)))
        for _ in range(n):
            code = read_reply(s, pending)[:3].decode()
            codes[code] = codes.get(code, 0) + 1
        rss, uss = memory([session])
        peak_rss, peak_uss = max(peak_rss, rss), max(peak_uss, uss)
    s.sendall(b"QUIT\r\n")
    try:
        read_reply(s, pending)
    except EOFError:
        pass
    s.close()
    return codes, peak_rss, peak_uss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--rcpts", type=int, default=10000)
    ap.add_argument("--maxrcpt", type=int, default=None, help="write control/maxrcpt")
    args = ap.parse_args()
    base, home = make_home()
    if args.maxrcpt is not None:
        with open(os.path.join(home, "control", "maxrcpt"), "w") as f:
            f.write("%d\n" % args.maxrcpt)
    limit = str(args.idle + 10)
    listener = subprocess.Popen([os.path.join(BIN, "qmail-smtpd-listen"), "-c", limit, "-s", limit,
                                 "127.0.0.1:0"], stderr=subprocess.PIPE,
                                env=dict(os.environ, QMAILHOME=home))
    limited = None
    socks = []
    try:
        line = listener.stderr.readline()
        port = int(re.search(rb":(\d+)\n", line).group(1))
        alone = psutil.Process(listener.pid).memory_info().rss
        t = time.perf_counter()
        socks = idle_connections(port, args.idle)
        opened = time.perf_counter() - t
        procs = sessions(listener)
        rss, uss = memory(procs)
        listener_rss = psutil.Process(listener.pid).memory_info().rss
        print("idle connections: %d open (%d sessions) in %.1f s" % (len(socks), len(procs), opened))
        print("  listener RSS %.1f MiB alone, %.1f MiB with them" % (mib(alone), mib(listener_rss)))
        print("  sessions: RSS %.1f MiB in all (%.2f each), USS %.1f MiB in all (%.2f each)"
              % (mib(rss), mib(rss) / max(1, len(procs)), mib(uss), mib(uss) / max(1, len(procs))))
        for s in socks:
            s.close()
        socks = []
        deadline = time.monotonic() + 60
        while sessions(listener) and time.monotonic() < deadline:
            time.sleep(0.05)
        codes, peak_rss, peak_uss = rcpt_flood(listener, port, args.rcpts)
        maxrcpt = os.path.join(home, "control", "maxrcpt")
        print("RCPT flood: %d RCPTs in one session (control/maxrcpt %s)"
              % (args.rcpts, open(maxrcpt).read().strip() if os.path.exists(maxrcpt) else "absent"))
        print("  replies: %s" % ", ".join("%s x%d" % kv for kv in sorted(codes.items())))
        print("  session peak RSS %.1f MiB, USS %.1f MiB" % (mib(peak_rss), mib(peak_uss)))
        print("  listener RSS %.1f MiB after the flood"
              % mib(psutil.Process(listener.pid).memory_info().rss))
        limited = subprocess.Popen([os.path.join(BIN, "qmail-smtpd-listen"), "-c", "40",
                                    "127.0.0.1:0"], stderr=subprocess.PIPE,
                                   env=dict(os.environ, QMAILHOME=home))
        port = int(re.search(rb":(\d+)\n", limited.stderr.readline()).group(1))
        greeted = refused = 0
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", port))
            socks.append(s)
            pending = [b""]
            code = read_reply(s, pending)[:3]
            greeted += code == b"220"
            refused += code == b"421"
        print("per-client limit: 40 connections from 127.0.0.1 to -c 40 (default -s 20):"
              " %d greeted, %d refused with 421" % (greeted, refused))
    finally:
        for s in socks:
            s.close()
        for proc in (listener, limited):
            if proc is not None:
                proc.terminate()
                proc.wait()
                proc.stderr.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
