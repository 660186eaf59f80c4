"""qmail-rspawn: qmail-send's remote spawner (docs/delivery.md "qmail-rspawn"; docs/protocols.md "qmail-send ↔ spawners").

Runs in queue/mess, clears lock/tcpto and lock/tcpto6 at start, and serves spawn commands
with qmailpy.spawn.serve. The commands that arrive together for one message and
recipient domain go to a delivery worker as one qmail-remote run with all their
recipients (qmailpy.remote.workerpool), which keeps the SMTP connection open for
the next message to the same peer. If $QMAILREMOTE names a program, each
delivery and recipient is instead a forked child that execs it, as qmail does.
report() folds qmail-remote's records for one recipient into its K/Z/D reply.
"""
import errno
import os

# errno values qmail's error_temp() counts as temporary: an exec failing with
# one of these is a deferral (exit 111), anything else a failure (exit 100).
_TEMP_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EINTR", "ENOMEM", "ETXTBSY", "EIO", "ETIMEDOUT", "EWOULDBLOCK", "EAGAIN", "EDEADLK",
    "EBUSY", "ENFILE", "EMFILE", "EFBIG", "ENOSPC", "ENETDOWN", "ENETUNREACH", "ENETRESET",
    "ECONNABORTED", "ECONNRESET", "ECONNREFUSED", "EHOSTDOWN", "EHOSTUNREACH", "EDQUOT",
    "ESTALE", "ENOLCK") if hasattr(errno, name))


def report(wstat, output):
    """letter + text for qmail-send from one qmail-remote's exit status and records."""
    if os.WIFSIGNALED(wstat):
        return b"Zqmail-remote crashed.\n"
    code = os.waitstatus_to_exitcode(wstat)
    if code == 111:
        return b"ZUnable to run qmail-remote.\n"
    if code != 0:
        return b"DUnable to run qmail-remote.\n"
    if not output:
        return b"Zqmail-remote produced no output.\n"

    s = output
    result = -1                      # 1 K, 0 Z, -1 D or no verdict
    start = 0
    for k, ch in enumerate(s):
        if ch == 0:
            letter = s[start:start + 1]
            if letter == b"K":
                result = 1
                break
            if letter == b"Z":
                result = 0
                break
            if letter == b"D":
                break
            start = k + 1
    override = result
    if s[:1] == b"s":
        override = 0
    elif s[:1] == b"h":
        override = -1
    reply = {1: b"K", 0: b"Z", -1: b"D"}[override]

    end = s.find(b"\0", 1)
    if end >= 0:
        reply += s[1:end]
        k = end + 1
        if result <= override and k < len(s) and s[k:k + 1] in (b"K", b"Z", b"D"):
            nul = s.find(b"\0", k + 1)
            reply += s[k + 1:] if nul < 0 else s[k + 1:nul]
    return reply


def make_runner(home):
    """run_delivery(sender, recipient) for spawn.serve, bound to the home."""
    program = os.environ.get("QMAILREMOTE")

    def run_delivery(sender, recipient):
        domain = recipient[recipient.rfind(b"@") + 1:]
        if program:
            try:
                os.execvp(program, [program, os.fsdecode(domain), os.fsdecode(sender),
                                    os.fsdecode(recipient)])
            except OSError as e:
                return 111 if e.errno in _TEMP_ERRNOS else 100
        from qmailpy.remote.deliver import run
        return run([domain, sender, recipient], home)
    return run_delivery


def preload():
    """Import what the workers use once, in the spawner, so no worker pays for it."""
    import qmailpy.remote.addrsort     # noqa: F401
    import qmailpy.remote.cache        # noqa: F401
    import qmailpy.remote.deliver      # noqa: F401
    import qmailpy.remote.dns          # noqa: F401
    import qmailpy.remote.routes       # noqa: F401
    import qmailpy.remote.smtp         # noqa: F401
    import qmailpy.remote.smtputf8     # noqa: F401
    import qmailpy.remote.starttls     # noqa: F401
    import qmailpy.remote.tcpto        # noqa: F401
    import qmailpy.remote.tls          # noqa: F401
    import ssl                         # noqa: F401  (STARTTLS; 13-30 ms to import in each child)
    import qmailpy.home                # noqa: F401
    import qmailpy.resolver            # noqa: F401
    import qmailpy.remote.dkimsign     # noqa: F401
    try:
        import dns.nameserver          # noqa: F401
        import dns.resolver            # noqa: F401  (MX lookups; 100+ ms to import)
    except ImportError:
        pass
    try:
        import dkim                    # noqa: F401  (DKIM signing; about 130 ms with PyNaCl)
        import nacl.signing            # noqa: F401
    except ImportError:
        pass


def serve(home, infd=0, outfd=1):
    """Run qmail-rspawn for a home until qmail-send closes the command pipe; exit code."""
    from qmailpy import privs, spawn
    from qmailpy.remote import tcpto
    home = os.path.abspath(home)
    try:
        os.chdir(home)
        os.chdir("queue/mess")
    except OSError:
        return 111
    try:
        owner = privs.account(home, "qmailq").uid
    except privs.PrivError:
        return 111
    tcpto.clean("../lock/tcpto")
    tcpto.clean("../lock/tcpto6", tcpto.IPV6)
    pool = None
    if not os.environ.get("QMAILREMOTE"):
        preload()
        from qmailpy.remote.workerpool import RemoteWorkers
        pool = RemoteWorkers(home)
        import gc
        gc.freeze()          # workers then leave the preloaded objects' pages shared
    return spawn.serve(make_runner(home), report, expected_owner=owner, infd=infd, outfd=outfd,
                       pool=pool)
