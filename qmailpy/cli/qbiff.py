"""qbiff: tell a logged-in user about new mail on their terminals (qbiff(1)).

Used in a .qmail file as ``|qbiff``. As qmail's: for each utmp login of
$USER whose terminal (a name under /dev, no '/' first and no '.') is open to
appends, belongs to this user and has the owner-execute bit (``biff y``),
write ``CR LF BEL *** TO <$LOCAL> FROM <$SENDER> CR LF``, then four spaces,
the Subject field and the body's first bytes cut to 78 characters in all
(unprintable bytes as '/'), and CR LF. Always exits 0: a notice never makes
a delivery fail.
"""
import os
import struct
import sys

UTMP = "/var/run/utmp"
# glibc's struct utmp: type, pid, line[32], id[4], user[32], host[256], then 52 more bytes
RECORD = struct.Struct("=hxxi32s4s32s256s52x")
USER_PROCESS = 7
TEXT_MAX = 78


def printable(data, replacement):
    return bytes(c if 32 <= c <= 126 else replacement for c in data)


def notice(local, sender, message):
    """The bytes qbiff writes for a message (read from the binary stream `message`)."""
    from qmailpy.inject.headers import read_header
    header = read_header(message)
    text = b"    "
    for field in header.fields:
        if field.key == b"subject":
            text += field.body().lstrip(b" \t")
    if len(text) < TEXT_MAX:
        text += header.body_start + message.read(TEXT_MAX)
    tofrom = printable(b"*** TO <" + local + b"> FROM <" + sender + b">", 95)     # '_'
    return b"\r\n\a" + tofrom + b"\r\n" + printable(text[:TEXT_MAX], 47) + b"\r\n"


def terminals(user, utmp=UTMP):
    """The /dev names of user's logins in utmp."""
    try:
        with open(utmp, "rb") as f:
            data = f.read()
    except OSError:
        return []
    lines = []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        kind, _, line, _, name, _ = RECORD.unpack_from(data, off)
        if kind != USER_PROCESS or name.split(b"\0", 1)[0] != user[:32]:
            continue
        line = line.split(b"\0", 1)[0]
        if line and not line.startswith(b"/") and b"." not in line:
            lines.append(line)
    return lines


def main(argv=None):
    env = os.environb
    user, sender, local = env.get(b"USER"), env.get(b"SENDER"), env.get(b"LOCAL")
    if user is None or sender is None or local is None or len(user) > 32:
        return 0
    try:
        os.chdir("/dev")
        woof = notice(local, sender, open(0, "rb", closefd=False))
    except OSError:
        return 0
    for line in terminals(user):
        try:
            fd = os.open(line, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_mode & 0o100 and st.st_uid == os.getuid():
                os.write(fd, woof)
        except OSError:
            pass
        finally:
            os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
