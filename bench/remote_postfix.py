"""Remote delivery to one domain served by Postfix's smtp-sink, qmailpy and Postfix side by side.

    .venv/bin/python bench/remote_postfix.py [-n 2000] [-l 2000] [--rounds 2]
                                             [--backend dir|log|both] [--rcpts 1]

Root only. Installs Postfix from Debian if missing (bench/sendmail_postfix.py).
One smtp-sink (`smtp-sink -u nobody 127.0.0.1:2626 1000`) takes every message of every
round. Each round fills a queue with N messages for `sink.example` while
delivery is held, then releases it and times until the last message is
reported delivered:

qmailpy: a home made by `qmailctl init` (every role `nobody`),
control/smtproutes `sink.example:[127.0.0.1]:2626`, N messages queued with
qmail-queue's code, then `qmail-start ./Maildir/` (qmail-send, qmail-rspawn
and its delivery workers, concurrencyremote 20); the time runs from the start
to the N-th `delivery K: success:` line of qmail-send's log (inotify on it).

Postfix: relayhost [127.0.0.1]:2626, defer_transports=smtp while N messages
are submitted with its sendmail, then defer_transports emptied, `postfix
reload` and `postqueue -f`; the time runs from there to the N-th `status=sent`
line of its log (maillog_file, postlogd; inotify on it). Its smtp client keeps
connections (smtp_connection_cache_on_demand) with 20 per destination, as
qmailpy's 20 remote slots.

--rcpts R gives each message R recipients in the domain. CPU ms per message is
by program over each system's process tree during the delivery phase.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from inotify_simple import INotify, flags

from deliver import make_home, start_send
from sendmail_postfix import (cpu_per_message, cpu_snapshot, install_postfix, postfix_version,
                              print_summary, report_round, run_command)

SINK_PORT = 2626
DOMAIN = "sink.example"
POSTFIX_LOG = "/var/log/qmailpy-bench-postfix.log"


def lines_until(path, needle, count, deadline, start_at=0):
    """Wait (inotify) until path holds count lines containing needle after byte start_at;
    the time the last one was seen."""
    ino = INotify()
    ino.add_watch(path, flags.MODIFY)
    seen, last, offset, rest = 0, None, start_at, b""
    while seen < count:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        offset += len(data)
        chunk = rest + data
        lines = chunk.split(b"\n")
        rest = lines.pop()
        found = sum(needle in line for line in lines)
        if found:
            seen += found
            last = time.time()
        if seen >= count:
            break
        if time.time() > deadline:
            raise SystemExit("only %d of %d '%s' lines in %s" % (seen, count, needle.decode(), path))
        ino.read(timeout=1000)
    return last


def message(i, rcpts, size):
    to = ", ".join("r%d.%d@%s" % (i, k, DOMAIN) for k in range(rcpts))
    head = "From: bench@bench.example\nTo: %s\nSubject: remote %d\n\n" % (to, i)
    return head.encode() + b"x" * max(0, size - len(head) - 1) + b"\n"


def qmailpy_round(base, backend, args):
    """(messages/s, CPU ms/message by program) for one filled queue delivered."""
    from qmailpy.queue.client import QueueClient
    run_dir = tempfile.mkdtemp(prefix="remote-", dir=base)
    os.chmod(run_dir, 0o755)
    home, _, env = make_home(run_dir, "nobody", backend)
    with open(os.path.join(home, "control", "smtproutes"), "w") as f:
        f.write("%s:[127.0.0.1]:%d\n" % (DOMAIN, SINK_PORT))
    recipients = lambda i: [b"r%d.%d@%s" % (i, k, DOMAIN.encode()) for k in range(args.rcpts)]  # noqa: E731
    for i in range(args.n):
        qq = QueueClient(home)
        qq.write(message(i, args.rcpts, args.l))
        result = qq.finish(b"bench@bench.example", recipients(i))
        if not result.ok:
            raise SystemExit("qmail-queue failed: %r" % result)
    logpath = os.path.join(run_dir, "send.log")
    start = time.time()
    send = start_send(env, logpath)
    try:
        before = cpu_snapshot([send.pid])
        last = lines_until(logpath, b": success: ", args.n * args.rcpts, start + max(600, args.n))
        after = cpu_snapshot([send.pid])
    finally:
        send.send_signal(signal.SIGTERM)
        send.wait(timeout=120)
    return args.n / (last - start), cpu_per_message(before, after, args.n)


def postfix_round(args):
    install_postfix()
    settings = {"myhostname": "bench.example", "mydestination": "localhost",
                "inet_interfaces": "loopback-only", "inet_protocols": "ipv4",
                "relayhost": "[127.0.0.1]:%d" % SINK_PORT, "maillog_file": POSTFIX_LOG,
                # Debian's "Local only" install sets both to error
                "default_transport": "smtp", "relay_transport": "relay",
                "defer_transports": "smtp", "default_destination_concurrency_limit": "20",
                "message_size_limit": "0"}
    run_command(["postconf", "-e"] + ["%s=%s" % kv for kv in settings.items()])
    subprocess.run(["postfix", "stop"], capture_output=True)
    subprocess.run(["postsuper", "-d", "ALL"], capture_output=True)
    open(POSTFIX_LOG, "w").close()
    run_command(["postfix", "start"])
    try:
        env = {"PATH": "/usr/sbin:/usr/bin:/bin"}
        rcpts = lambda i: ["r%d.%d@%s" % (i, k, DOMAIN) for k in range(args.rcpts)]   # noqa: E731
        for i in range(args.n):
            subprocess.run(["/usr/sbin/sendmail", "-f", "bench@bench.example"] + rcpts(i),
                           input=message(i, args.rcpts, args.l), env=env, check=True)
        # every message is in the deferred or incoming queue before delivery is let go
        deadline = time.time() + max(600, args.n)
        while int(subprocess.run("postqueue -j | wc -l", shell=True, capture_output=True,
                                 text=True).stdout) < args.n:
            if time.time() > deadline:
                raise SystemExit("Postfix did not take every message")
            time.sleep(0.2)
        start_offset = os.path.getsize(POSTFIX_LOG)
        with open("/var/spool/postfix/pid/master.pid") as f:
            master = int(f.read().split()[0])
        run_command(["postconf", "-e", "defer_transports="])
        start = time.time()
        before = cpu_snapshot([master])
        run_command(["postfix", "reload"])
        run_command(["postqueue", "-f"])
        last = lines_until(POSTFIX_LOG, b"status=sent", args.n * args.rcpts, start + max(600, args.n),
                           start_offset)
        after = cpu_snapshot([master])
    finally:
        subprocess.run(["postfix", "stop"], capture_output=True)
    return args.n / (last - start), cpu_per_message(before, after, args.n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="messages per round (default 2000)")
    parser.add_argument("-l", type=int, default=2000, help="message size in bytes (default 2000)")
    parser.add_argument("--rcpts", type=int, default=1, help="recipients per message (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per system (default 2)")
    parser.add_argument("--backend", choices=("dir", "log", "both"), default="dir")
    parser.add_argument("--no-postfix", action="store_true", help="qmailpy only")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/remote_postfix.py must run as root", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="qmailpy-bench-")
    os.chmod(base, 0o755)
    sink = subprocess.Popen(["smtp-sink", "-u", "nobody", "127.0.0.1:%d" % SINK_PORT, "1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    if sink.poll() is not None:
        raise SystemExit("smtp-sink did not start: %s" % sink.stderr.read().decode(errors="replace"))
    results = {}
    try:
        print("%d messages of %d bytes, %d recipient(s) each, to smtp-sink on 127.0.0.1:%d; "
              "%d rounds" % (args.n, args.l, args.rcpts, SINK_PORT, args.rounds))
        backends = ("dir", "log") if args.backend == "both" else (args.backend,)
        for k in range(args.rounds):
            for backend in backends:
                rate, cpu = qmailpy_round(base, backend, args)
                report_round("qmailpy (%s) r%d" % (backend, k + 1), rate, cpu)
                results.setdefault("qmailpy (%s)" % backend, []).append(rate)
            if not args.no_postfix:
                rate, cpu = postfix_round(args)
                name = "Postfix %s" % postfix_version()
                report_round("%s r%d" % (name, k + 1), rate, cpu)
                results.setdefault(name, []).append(rate)
        print_summary(results)
    finally:
        sink.send_signal(signal.SIGTERM)
        sink.wait()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
