"""A remote host for the crash-state explorer (tests/test_crash_states.py): a small SMTP
server that keeps every message it accepts in a Maildir, made durable (file fsync'd,
linked into new/, new/ fsync'd) before its 250 to the dot, as a careful MTA does.

    python maildir_peer.py FD MAILDIR PIDFILE [--then PROGRAM ARG...]

FD is a listening TCP socket inherited from the caller. The server writes its pid to
PIDFILE once it accepts and runs until SIGTERM. With --then, it runs as a grandchild
(double fork: the program is not its parent) and this process, once the server's pid
is in PIDFILE, closes FD and execs PROGRAM: so one strace run records the peer's file
operations together with qmail-send's, in the order they happened. Each stored message
starts with `X-Peer-Rcpt: ADDRESS` lines, then the data as received (CRLF to LF,
leading dots unstuffed).
"""
import os
import socket
import sys
import threading
import time

_count = [0]
_lock = threading.Lock()


def store(maildir, rcpts, data):
    with _lock:
        _count[0] += 1
        name = "%d.%d_%d.peer" % (time.time(), os.getpid(), _count[0])
    tmp = os.path.join(maildir, "tmp", name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        head = b"".join(b"X-Peer-Rcpt: %s\n" % r for r in rcpts)
        view = memoryview(head + data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.link(tmp, os.path.join(maildir, "new", name))     # as qmail-local: link, sync new/, unlink
    dfd = os.open(os.path.join(maildir, "new"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    os.unlink(tmp)


def session(conn, maildir):
    f = conn.makefile("rb")

    def say(line):
        conn.sendall(line + b"\r\n")

    say(b"220 peer.test ESMTP")
    rcpts = []
    try:
        for line in f:
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                say(b"250 peer.test")
            elif verb == b"MAIL":
                rcpts = []
                say(b"250 ok")
            elif verb == b"RCPT":
                rcpts.append(line.split(b"<", 1)[1].split(b">", 1)[0])
                say(b"250 ok")
            elif verb == b"DATA":
                say(b"354 go ahead")
                data = []
                for dl in f:
                    if dl == b".\r\n":
                        break
                    dl = dl[:-2] + b"\n" if dl.endswith(b"\r\n") else dl
                    data.append(dl[1:] if dl.startswith(b".") else dl)
                else:
                    return                  # the client went away before the dot
                store(maildir, rcpts, b"".join(data))
                say(b"250 ok: stored")
            elif verb == b"QUIT":
                say(b"221 bye")
                return
            elif verb == b"RSET":
                rcpts = []
                say(b"250 ok")
            else:
                say(b"502 unimplemented")
    except OSError:
        pass
    finally:
        f.close()
        conn.close()


def serve(fd, maildir, pidfile, ready=None):
    listener = socket.socket(fileno=fd)
    # SIGTERM keeps its default action, which ends the process whichever thread it lands
    # on: a Python handler runs in the main thread only, blocked in accept()
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % os.getpid())
    os.rename(tmp, pidfile)
    if ready is not None:
        os.close(ready)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=session, args=(conn, maildir), daemon=True).start()


def main(argv):
    fd, maildir, pidfile = int(argv[1]), argv[2], argv[3]
    if len(argv) > 5 and argv[4] == "--then":
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(r)
            if os.fork():
                os._exit(0)
            os.setsid()
            serve(fd, maildir, pidfile, w)
        os.close(w)
        os.waitpid(child, 0)
        while os.read(r, 1):            # end of file: the server closed its end, pid file written
            pass
        os.close(r)
        os.close(fd)
        os.execvp(argv[5], argv[5:])
    serve(fd, maildir, pidfile)


if __name__ == "__main__":
    main(sys.argv)
