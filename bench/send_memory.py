"""qmail-send's memory and restart time with N messages waiting in the queue.

    .venv/bin/python bench/send_memory.py [-n 100000[,1000000...]] [--backend dir|log]

Builds a throw-away home and fills its queue with N preprocessed messages, each
waiting for a remote retry far in the future, so nothing is delivered:
  dir  qmail's own layout (mess/S/n whose inode is n, info/S/n, remote/S/n);
  log  one REPLACEMENT record per message in queue/log (bench/logqueue.py's
       build_log; bodies are not needed until a delivery starts).
Then it starts the real daemons with qmail-start and prints qmail-send's RSS once
the startup scan is done (the status line) and again after its first cleanup walk,
plus the startup time; then it SIGKILLs qmail-send, starts the daemons again and
prints the time from qmail-start to the new status line (restart after a crash).
SIGALRM is not sent: the messages just wait.
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


def wait_status(logpath, proc, offset, limit=900):
    t = time.time()
    while b"status:" not in open(logpath, "rb").read()[offset:]:
        if proc.poll() is not None or time.time() - t > limit:
            raise SystemExit("qmail-send did not start: %r" % open(logpath, "rb").read()[-2000:])
        time.sleep(0.01)
    return time.time() - t


def fill_log(home, count, uid, gid):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from logqueue import build_log
    build_log(home, count)
    if os.geteuid() == 0:
        logdir = os.path.join(home, "queue", "log")
        for name in os.listdir(logdir):
            os.chown(os.path.join(logdir, name), uid, gid)


def one_run(count, backend, user):
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
        with open(os.path.join(home, "control", "queuebackend"), "w") as f:
            f.write(backend + "\n")
        t = time.time()
        if backend == "log":
            fill_log(home, count, pw.pw_uid, pw.pw_gid)
        else:
            fill(os.path.join(home, "queue"), count, pw.pw_uid, pw.pw_gid)
        print("== %s backend: queue filled with %d messages in %.1f s" % (backend, count, time.time() - t))
        logpath = os.path.join(base, "send.log")

        def start():
            with open(logpath, "ab") as log:
                return subprocess.Popen(["qmail-start", "./Maildir/"], stdout=log, stderr=log, env=env,
                                        cwd="/", start_new_session=True)
        send = start()
        started = wait_status(logpath, send, 0)
        proc = psutil.Process(send.pid)
        rss_start = proc.memory_info().rss
        # the first cleanup walk looks at every mess/ entry, one per loop iteration
        time.sleep(max(5.0, count / 20000))
        rss_later = proc.memory_info().rss
        cpu = proc.cpu_times()
        print("qmail-send startup scan: %.2f s" % started)
        print("qmail-send RSS with %d messages waiting: %.1f MiB after startup, %.1f MiB after %.0f s"
              % (count, rss_start / 2 ** 20, rss_later / 2 ** 20, time.time() - t))
        print("qmail-send CPU so far: user %.1f s, system %.1f s" % (cpu.user, cpu.system))
        children = proc.children()
        send.send_signal(signal.SIGKILL)
        send.wait()
        psutil.wait_procs(children, timeout=60)        # the helpers see their pipes close
        offset = os.path.getsize(logpath)
        send = start()
        restarted = wait_status(logpath, send, offset)
        print("restart after SIGKILL: %.2f s from qmail-start to the status line" % restarted)
        return 0
    finally:
        if send is not None and send.poll() is None:
            send.send_signal(signal.SIGTERM)
            send.wait(timeout=600)
        shutil.rmtree(base, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", default="100000", help="messages waiting; a comma list runs each (default 100000)")
    parser.add_argument("--backend", choices=("dir", "log"), default="dir")
    args = parser.parse_args()
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    for count in (int(x) for x in args.n.split(",")):
        one_run(count, args.backend, user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
