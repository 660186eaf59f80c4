"""The qmail home (QMAILHOME) and its control/ files (docs/control-files.md "Control files").

Single-value files: first line, trailing spaces/tabs stripped. Numbers: qmail's
control_readint, the leading decimal digits of that line, else the default
(control_int, the one reader of every numeric file). List files: every
line, trailing whitespace stripped, empty and '#' lines skipped. A missing file
(ENOENT) means the default; any other error raises ControlError, which callers
turn into their program's "unable to read controls" failure.
"""
import errno
import os

DEFAULT_HOME = "/var/qmail"
BIN = "bin"     # HOME/bin: the programs, as launchers that `qmailctl init` writes (qmailctl(8))


class ControlError(Exception):
    """A control file exists but cannot be read."""


def qmail_home(explicit=None):
    """The home every program works in: --home, else $QMAILHOME, else /var/qmail."""
    return explicit or os.environ.get("QMAILHOME") or DEFAULT_HOME


def _read(home, name):
    return control_bytes("%s/control/%s" % (home, name), "control/" + name)


def control_bytes(path, label):
    """The bytes of the control file at path, None when it is missing; ControlError
    ("unable to read LABEL: why") when it cannot be read."""
    # Plain descriptors, not open(): a session or a queueing worker reads about ten control
    # files per message, and a file object costs more than the open and read themselves.
    # Root's daemons read here too, and a single-user home's control/ is its user's
    # (docs/security.md "Root and other accounts' directories"): O_NONBLOCK and fstat, so
    # a FIFO cannot hang the reader; as root, a symlink only when root made it in a
    # control/ only root can write (qmailpy.nofollow's rule), else another account could
    # have root read /etc/shadow as control/me.
    root = os.geteuid() == 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_NOFOLLOW if root else 0))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        if not (root and e.errno == errno.ELOOP):
            raise ControlError("unable to read %s: %s" % (label, e.strerror)) from e
        fd = _open_roots_link(path, label)
        if fd is None:
            return None
    try:
        import stat
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):       # a directory: EISDIR below
            raise ControlError("unable to read %s: not a regular file" % label)
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError as e:            # a directory where a file should be: EISDIR
        raise ControlError("unable to read %s: %s" % (label, e.strerror)) from e
    finally:
        os.close(fd)


def _open_roots_link(path, label):
    """The descriptor of the file the symlink path names, when root made the link in a
    directory only root can write (an administrator's control/rcpthosts -> a shared
    file); None when its target is missing; ControlError otherwise."""
    try:
        link = os.lstat(path)
        directory = os.stat(os.path.dirname(path))
        if link.st_uid != 0 or directory.st_uid != 0 or directory.st_mode & 0o022:
            raise ControlError("unable to read %s: a symbolic link another account "
                               "could have made" % label)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ControlError("unable to read %s: %s" % (label, e.strerror)) from e


def first_line(data):
    """A single-value file's value: its first line, trailing spaces, tabs and CR removed."""
    return data.split(b"\n", 1)[0].rstrip(b" \t\r")


def control_value(home, name, default=None):
    """A single-value control file as bytes, or default when absent."""
    data = _read(home, name)
    if data is None:
        return default
    return first_line(data)


def control_list(home, name, default=None):
    """A list control file as a list of bytes lines, or default when absent."""
    data = _read(home, name)
    if data is None:
        return default
    lines = []
    for line in data.split(b"\n"):
        line = line.rstrip(b" \t\r")
        if line and not line.startswith(b"#"):
            lines.append(line)
    return lines


INT_MAX = 2 ** 31 - 1         # qmail stores the value in a C int


def scan_ulong(value):
    """qmail's scan_ulong: the number the leading decimal digits of value (bytes or str)
    spell, or None when it does not start with one. No sign, no leading space: "-1",
    "  30" and "" have none; "30abc" is 30. Capped at INT_MAX, where qmail's C int wraps."""
    if isinstance(value, str):
        value = value.encode("latin-1", "replace")
    digits = len(value) - len(value.lstrip(b"0123456789"))
    if not digits:
        return None
    return min(int(value[:digits]), INT_MAX)


def control_int(home, name, default, low=0, high=INT_MAX):
    """A numeric control file the way qmail's control_readint reads it: scan_ulong of
    its first line, else (no leading digit, or no file) default; then kept within
    low..high (qmail's caps, such as 120 deliveries per channel). Every numeric
    control file of every program is read here (docs/control-files.md "Control files")."""
    return readint(control_value(home, name), default, low, high)


def readint(line, default, low=0, high=INT_MAX):
    """control_int for a first line already read (None: no file)."""
    number = None if line is None else scan_ulong(line)
    if number is None:
        return default
    return max(low, min(high, number))


def control_me_default(home, name):
    """A value defaulting to control/me, else the literal file name (docs/control-files.md "Control files")."""
    value = control_value(home, name)
    if value is None:
        value = control_value(home, "me")
    return value if value is not None else name.encode()


MINI_MARK = "control/qmqpservers"


def mini_queue(home):
    """HOME/bin/qmail-queue when HOME is a mini-qmail home (`qmailctl init --mini`: no
    queue/, a control/qmqpservers), where that program is qmail-qmqpc; else None."""
    try:
        os.stat(os.path.join(home, "queue"))
        return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    if os.path.exists(os.path.join(home, MINI_MARK)):
        return os.path.join(home, BIN, "qmail-queue")
    return None


def has_queue_rights(home):
    """May this process write the queue itself? Root (qmail-queue's code then becomes
    qmailq) or the owner of HOME/queue (qmailq, or the one account of a single-user
    home). A queue that cannot be stat'd counts as ours: qmail-queue reports it."""
    euid = os.geteuid()
    if euid == 0:
        return True
    try:
        return os.stat(os.path.join(home, "queue")).st_uid == euid
    except OSError:
        return True
