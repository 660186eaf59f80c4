"""qmail-send's memory with 100,000 messages waiting in the queue.

    .venv/bin/python bench/send_memory.py [-n 100000]

Builds a throw-away home and fills its queue with N preprocessed messages in
qmail's own layout (mess/S/n whose inode is n, info/S/n, remote/S/n), each
waiting for a remote retry an hour from now, so nothing is delivered. Then it
starts the real daemons with qmail-start and prints qmail-send's RSS once the
startup scan is done (the status line) and again after its first cleanup walk
over mess/, plus the startup time. SIGALRM is not sent: the messages just wait.
"""
import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil


def fill(queue, count, uid, gid):
    due = int(time.time()) + 3600
    birth = int(time.time())
    chown = os.geteuid() == 0
    body = b"Received: (qmail 1 invoked by uid 0); 1 Jan 2026 00:00:00 -0000\nSubject: waiting\n\nx\n"
    pid_dir = os.path.join(queue, "pid")
    for i in range(count):
        tmp = os.path.join(pid_dir, "fill.%d" % i)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, body)
        n = os.fstat(fd).st_ino
        os.close(fd)
        s = n % 23
        mess = os.path.join(queue, "mess", str(s), str(n))
        os.link(tmp, mess)
        os.unlink(tmp)
        info = os.path.join(queue, "info", str(s), str(n))
        remote = os.path.join(queue, "remote", str(s), str(n))
        for path, data in ((info, b"Fsender@bench.example\0"),
                           (remote, b"Twaiting%d@far.example\0" % i)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, data)
            os.close(fd)
            if chown:
                os.chown(path, uid, gid)
        if chown:
            os.chown(mess, uid, gid)
        os.utime(info, (birth, birth))
        os.utime(remote, (due, due))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=100000, help="messages waiting (default 100000)")
    args = parser.parse_args()
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    pw = pwd.getpwnam(user)
    base = tempfile.mkdtemp(prefix="qmailpy-membench-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               QMAILHOME=home)
    send = None
    try:
        subprocess.run(["qmailctl", "init", "--home", home, "--me", "bench.example", "--user", user],
                       env=env, check=True, capture_output=True)
        t = time.time()
        fill(os.path.join(home, "queue"), args.n, pw.pw_uid, pw.pw_gid)
        print("queue filled with %d messages in %.1f s" % (args.n, time.time() - t))
        logpath = os.path.join(base, "send.log")
        log = open(logpath, "wb")
        t = time.time()
        send = subprocess.Popen(["qmail-start", "./Maildir/"], stdout=log, stderr=log, env=env,
                                cwd="/", start_new_session=True)
        while b"status:" not in open(logpath, "rb").read():
            if send.poll() is not None or time.time() - t > 600:
                raise SystemExit("qmail-send did not start: %r" % open(logpath, "rb").read())
            time.sleep(0.02)
        started = time.time() - t
        proc = psutil.Process(send.pid)
        rss_start = proc.memory_info().rss
        # the first cleanup walk looks at every mess/ entry, one per loop iteration
        time.sleep(max(5.0, args.n / 20000))
        rss_later = proc.memory_info().rss
        cpu = proc.cpu_times()
        print("qmail-send startup scan: %.1f s" % started)
        print("qmail-send RSS with %d messages waiting: %.1f MiB after startup, %.1f MiB after %.0f s"
              % (args.n, rss_start / 2 ** 20, rss_later / 2 ** 20, time.time() - t))
        print("qmail-send CPU so far: user %.1f s, system %.1f s" % (cpu.user, cpu.system))
        print("log: %s" % open(logpath, "rb").read().decode(errors="replace").strip().splitlines()[:3])
        return 0
    finally:
        if send is not None and send.poll() is None:
            send.send_signal(signal.SIGTERM)
            send.wait(timeout=600)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
