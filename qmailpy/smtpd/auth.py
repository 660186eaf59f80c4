"""SMTP AUTH (RFC 4954) for the submission port: PLAIN and LOGIN, checked by checkpassword.

qmail-smtpd offers AUTH when SMTPAUTH is set in its environment (SMTPAUTH=!
also requires it before MAIL, as the qmail AUTH patches read that variable),
only inside TLS, and only when control/checkpassword names a program. That
program follows the checkpassword interface: it reads user\\0password\\0timestamp\\0
from fd 3 and exits 0 when the password is right (then it runs its arguments:
here `true`), 1 when it is wrong, anything else on a temporary problem. It gets
control/timeoutcheckpassword seconds, then its process group is killed.
"""
import binascii
import os
import select
import signal

from qmailpy.home import control_int, control_value

MECHANISMS = b"LOGIN PLAIN"
DEFAULT_TIMEOUT = 10
# Each wrong password is answered after FAIL_DELAY seconds; MAX_FAILURES of them end the session.
FAIL_DELAY = 1.0
MAX_FAILURES = 3

OK, BAD, TEMPORARY = "ok", "bad", "temporary"


class Malformed(Exception):
    """Not base64, or not the mechanism's form: answered 501."""


def checkpassword_argv(home):
    """The program and arguments in control/checkpassword, or None when there is none."""
    value = control_value(home, "checkpassword")
    if not value:
        return None
    return [os.fsdecode(word) for word in value.split()]


def checkpassword_timeout(home):
    return control_int(home, "timeoutcheckpassword", DEFAULT_TIMEOUT, low=1)


def decode(text):
    """Strict base64 (RFC 4954: "=" alone is an empty response)."""
    if text == b"=":
        return b""
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise Malformed() from None


def plain_credentials(response):
    """(user, password) from a PLAIN response: authzid NUL authcid NUL password."""
    parts = decode(response).split(b"\0")
    if len(parts) != 3 or not parts[1]:
        raise Malformed()
    return parts[1], parts[2]


def check(argv, user, password, timeout, environ):
    """OK, BAD or TEMPORARY: the verdict of the checkpassword program argv."""
    if b"\0" in user or b"\0" in password:
        return BAD
    r, w = os.pipe()
    try:
        if r == 3:
            os.set_inheritable(r, True)     # dup2(3, 3) would leave close-on-exec set
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_DUP2, r, 3)]
        try:
            pid = os.posix_spawnp(argv[0], argv + ["true"], environ, file_actions=actions,
                                  setpgroup=0)
        except OSError:
            return TEMPORARY
        os.close(r)
        r = -1
        try:
            os.write(w, user + b"\0" + password + b"\0\0")
        except OSError:             # it exited without reading
            pass
    finally:
        if r >= 0:
            os.close(r)
        os.close(w)
    return _verdict(pid, timeout)


def _verdict(pid, timeout):
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(int(timeout * 1000)):
            # The group, and the program itself should it have left the group; one that
            # cannot be signalled (a setuid program that made itself root) is not waited
            # for: the session would hang as long as it does.
            killed = False
            for kill, target in ((os.killpg, pid), (os.kill, pid)):
                try:
                    kill(target, signal.SIGKILL)
                    killed = True
                except OSError:
                    pass
            if killed:
                os.waitpid(pid, 0)
            return TEMPORARY
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return OK if code == 0 else BAD if code == 1 else TEMPORARY
