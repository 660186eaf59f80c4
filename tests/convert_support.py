"""Helpers for the qmailctl convert tests: a real directory queue with messages in every
state (build_dir_queue) and the bytes and mtimes of its envelope-side files (envelope_files).
"""
import os
import subprocess

from logqueue_harness import route
from qmailpy.backends.dir.queue import DirQueue
from qmailpy.send.clean import CleanClient


def envelope_files(queue):
    """{relative path: (bytes, mtime)} of every envelope-side queue file.

    (bounce/n's mtime means nothing to qmail and is not kept.)"""
    out = {}
    for kind in ("todo", "info", "local", "remote", "bounce"):
        for dirpath, _, names in os.walk(os.path.join(queue, kind)):
            for name in names:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    mtime = None if kind == "bounce" else int(os.stat(path).st_mtime)
                    out[os.path.relpath(path, queue)] = (f.read(), mtime)
    return out


def build_dir_queue(qmail_home):
    for i in range(4):
        done = qmail_home.queue_message(b"Subject: %d\n\nbody %d\n" % (i, i), b"s%d@x.example" % i,
                                        [b"a%d@test.example" % i, b"b%d@r.example" % i, b"c@r.example"])
        assert done.returncode == 0
    clean = subprocess.Popen(["qmail-clean"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=qmail_home.env)
    try:
        dq = DirQueue(qmail_home.path, cleaner=CleanClient(clean.stdin.fileno(), clean.stdout.fileno()))
        ns = sorted(dq.new_work())
        for n in ns[:3]:
            dq.preprocess(n, route)
        a, b = ns[0], ns[1]
        local = dq.recipients(a, "local")
        dq.mark_done(a, "local", local[0])
        remote = dq.recipients(a, "remote")
        dq.add_bounce_note(a, b"<b0@r.example>:\nno such user\n\n")
        dq.mark_done(a, "remote", remote[0])
        dq.reschedule(a, "remote", 2000000000)
        dq.reschedule(b, "remote", 1900000000)
    finally:
        clean.stdin.close()
        clean.wait(timeout=30)
    return ns
