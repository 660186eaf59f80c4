"""One qmail-local run (qmail-local(8); docs/delivery.md "qmail-local").

deliver() is the whole program after argument parsing: home directory
checks, the Delivered-To loop check, the environment, choosing the .qmail
file, then its instructions in order (forwards collected and queued last).
It returns qmail-local's exit status: 0 after printing ``did F+W+P`` (and
``qp N`` when a forward was queued), 111 or 100 after printing one line
saying why. qmail-lspawn calls it in a forked child; the qmail-local
program calls it from main().

The message is read from msgfd, which must be seekable: it is rewound for
every instruction.
"""
import os
import signal
import time

from qmailpy.fileio import write_all
from qmailpy.local import dotqmail
from qmailpy.local.errors import Failure, error_str

USAGE = (b"qmail-local: usage: qmail-local [ -nN ] user homedir local dash ext"
         b" domain sender aliasempty")
LOOPING = b"This message is looping: it already has my Delivered-To line. (#5.4.6)"
NO_MAILBOX = b"Sorry, no mailbox here by that name. (#5.1.1)"


def _write(fd, data):
    try:
        write_all(fd, data)
    except OSError:
        pass                            # nobody listening: the exit status still tells


def _rewind(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        raise Failure(111, b"Unable to rewind message. (#4.3.0)") from None


def check_home(flagdoit, errfd):
    try:
        st = os.stat(".")
    except OSError as e:
        raise Failure(111, b"Unable to stat home directory: " + error_str(e)
                      + b". (#4.3.0)") from e
    if st.st_mode & dotqmail.PATERNALISM:
        raise Failure(111, b"Uh-oh: home directory is writable. (#4.7.0)")
    if st.st_mode & 0o1000:
        if flagdoit:
            raise Failure(111, b"Home directory is sticky: user is editing his .qmail file. (#4.2.1)")
        _write(errfd, b"Warning: home directory is sticky.\n")


def check_loop(msgfd, dtline):
    """Refuse (100) a message whose header already has our Delivered-To line."""
    _rewind(msgfd)
    buf = b""
    pos = 0
    while True:
        nl = buf.find(b"\n", pos)
        if nl < 0:
            try:
                chunk = os.read(msgfd, 65536)
            except OSError as e:
                raise Failure(111, b"Unable to read message: " + error_str(e)
                              + b". (#4.3.0)") from e
            if not chunk:
                return                  # a last line without LF is not compared
            buf = buf[pos:] + chunk
            pos = 0
            continue
        line = buf[pos:nl + 1]
        pos = nl + 1
        if len(line) <= 1:
            return
        if line == dtline:
            raise Failure(100, LOOPING)


def _host_prefix(host, end):
    """host[:end] cut before its last '.', or unchanged when there is none."""
    dot = host.rfind(b".", 0, end)
    return dot if dot >= 0 else end


def ufline(sender, when):
    from qmailpy.envelope import ufline_date
    if sender:
        s = sender.replace(b" ", b"-").replace(b"\t", b"-").replace(b"\n", b"-")
    else:
        s = b"MAILER-DAEMON"
    return b"From " + s + b" " + ufline_date(when) + b"\n"


def environment(user, homedir, local, ext, host, sender, dtline, rpline, uf):
    """The variables qmail-local adds to the environment (all but DEFAULT, NEWSENDER)."""
    env = {
        b"HOST": host, b"HOME": homedir, b"USER": user, b"LOCAL": local,
        b"RECIPIENT": local + b"@" + host, b"DTLINE": dtline, b"SENDER": sender,
        b"RPLINE": rpline, b"UFLINE": uf, b"EXT": ext,
    }
    x = ext
    for name in (b"EXT2", b"EXT3", b"EXT4"):
        dash = x.find(b"-")
        x = x[dash + 1:] if dash >= 0 else b""
        env[name] = x
    end = len(host)
    for name in (b"HOST2", b"HOST3", b"HOST4"):
        end = _host_prefix(host, end)
        env[name] = host[:end]
    return env


def deliver(user, homedir, local, dash, ext, host, sender, aliasempty,
            flagdoit=True, home=None, msgfd=0, outfd=1, errfd=2, environ=None):
    """Run qmail-local; returns its exit status. All arguments are bytes. environ: a plain
    dict of what os.environb holds (a delivery worker has it), to copy instead of reading
    os.environb back."""
    try:
        return _deliver(user, homedir, local, dash, ext, host, sender, aliasempty,
                        flagdoit, home, msgfd, outfd, errfd, environ)
    except Failure as f:
        if f.text:
            _write(errfd, f.text + b"\n")
        return f.code


def _deliver(user, homedir, local, dash, ext, host, sender, aliasempty,
             flagdoit, home, msgfd, outfd, errfd, environ):
    os.umask(0o077)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if not homedir.startswith(b"/"):
        raise Failure(100, USAGE)
    if home is None:
        from qmailpy.home import qmail_home
        home = qmail_home()
    home = os.path.abspath(home)        # forwards chdir there after we moved to homedir
    try:
        os.chdir(homedir)
    except OSError as e:
        raise Failure(111, b"Unable to switch to " + homedir + b": " + error_str(e)
                      + b". (#4.3.0)") from e
    check_home(flagdoit, errfd)

    recipient = local + b"@" + host
    dtline = b"Delivered-To: " + recipient.replace(b"\n", b"_") + b"\n"
    if flagdoit:
        check_loop(msgfd, dtline)
    from qmailpy.envelope import quote2
    rpline = b"Return-Path: <" + quote2(sender).replace(b"\n", b"_") + b">\n"
    uf = ufline(sender, time.time())

    env = dict(os.environb if environ is None else environ)
    env.update(environment(user, homedir, local, ext, host, sender, dtline, rpline, uf))
    name, cmds, forward_only, default = dotqmail.find(dash, ext)
    if name is None and dash:
        raise Failure(100, NO_MAILBOX)
    if default is not None:
        env[b"DEFAULT"] = default
    newsender = dotqmail.new_sender(local, host, sender, dash, ext)
    env[b"NEWSENDER"] = newsender
    if not cmds:
        cmds = aliasempty
        forward_only = False

    counts = [0, 0, 0]                  # files, forwards, programs
    forwards = []
    for kind, arg in dotqmail.instructions(cmds):
        if kind in (dotqmail.MAILDIR, dotqmail.MBOX):
            counts[0] += 1
            if forward_only:
                raise Failure(111, b"Uh-oh: .qmail has file delivery but has x bit set. (#4.7.0)")
            if not flagdoit:
                _write(outfd, (b"maildir " if kind == dotqmail.MAILDIR else b"mbox ") + arg + b"\n")
            elif kind == dotqmail.MAILDIR:
                from qmailpy.local import maildir
                _rewind(msgfd)
                maildir.deliver(arg, msgfd, rpline, dtline)
            else:
                from qmailpy.local import mbox
                _rewind(msgfd)
                mbox.deliver(arg, msgfd, uf, rpline, dtline)
        elif kind == dotqmail.PROGRAM:
            counts[2] += 1
            if forward_only:
                raise Failure(111, b"Uh-oh: .qmail has prog delivery but has x bit set. (#4.7.0)")
            if not flagdoit:
                _write(outfd, b"program " + arg + b"\n")
                continue
            from qmailpy.local import program
            _rewind(msgfd)
            if program.run(arg, env, msgfd):
                break
        elif kind == dotqmail.FORWARD:
            counts[1] += 1
            if flagdoit:
                forwards.append(arg)
            else:
                _write(outfd, b"forward " + arg + b"\n")
        elif kind == dotqmail.LIST:
            forward_only = True

    qp = 0
    if forwards:
        from qmailpy.local.forward import forward
        _rewind(msgfd)
        qp = forward(home, msgfd, dtline, newsender, forwards)
    report = b"did %d+%d+%d\n" % tuple(counts)
    if qp:
        report += b"qp %d\n" % qp
    _write(outfd, report)
    return 0
