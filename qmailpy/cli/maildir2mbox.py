"""maildir2mbox: move the messages of $MAILDIR to the end of the mbox $MAIL (maildir2mbox(1)).

qmail's program, byte for byte: change into $MAILDIR; remove files in tmp/
not accessed for 36 hours; take every file of new/ and cur/ (names not
starting with '.') last modified before this second, oldest first. Then, under
an exclusive flock of $MAIL (opened for append, created mode 0600 if absent),
copy $MAIL to $MAILTMP, append each message there with a From_ line (the
Return-Path: first line's address, blanks turned into '-', MAILER-DAEMON for
<>, XXX without such a line, then the modification time as qmail's UFLINE
date), '>' before every line matching ^>*From , a newline at the end of an
unterminated message and an empty line; fsync $MAILTMP and rename it onto
$MAIL; only then remove the messages from the maildir (one it cannot remove
is reported: it will be delivered twice). $MAIL and $MAILTMP are relative to
$MAILDIR, as qmail's are. Exit 0 (also when there is nothing new), 111 with
``maildir2mbox: fatal: ...`` on any failure, with $MAIL unchanged.
"""
import os
import sys
import time

FATAL = "maildir2mbox: fatal: "
WARNING = "maildir2mbox: warning: "
TMP_AGE = 129600        # tmp/ files older than 36 hours are left-overs (maildir(5))


class Fatal(Exception):
    pass


def _sys(text, error):
    from qmailpy.local.errors import error_str
    return Fatal(text + ": " + error_str(error).decode())


def clean_tmp(now):
    try:
        names = os.listdir("tmp")
    except OSError:
        return
    for name in names:
        if name.startswith("."):
            continue
        try:
            if now > os.stat("tmp/" + name).st_atime + TMP_AGE:
                os.unlink("tmp/" + name)
        except OSError:
            pass


def scan(now):
    """[(mtime, 'new/NAME' or 'cur/NAME')], oldest first; only files older than this second
    (a later one may still be arriving in order)."""
    found = []
    for sub in ("new", "cur"):
        try:
            names = os.listdir(sub)
        except OSError as e:
            raise _sys("unable to scan $MAILDIR/" + sub, e) from e
        for name in names:
            if name.startswith("."):
                continue
            try:
                mtime = int(os.stat(sub + "/" + name).st_mtime)
            except OSError:
                continue
            if mtime < now:
                found.append((mtime, sub + "/" + name))
    found.sort()
    return found


def from_line(first, complete, when):
    """The From_ line of a message whose first line is `first` (complete: it ended in LF)."""
    from qmailpy.envelope import ufline_date
    head = b"From XXX "
    if complete and first.startswith(b"Return-Path: <"):
        if first[14:15] == b">":
            head = b"From MAILER-DAEMON "
        else:
            head = b"From " + first[14:len(first) - 2].replace(b" ", b"-").replace(b"\t", b"-") + b" "
    return head + ufline_date(when) + b"\n"


def append_message(put, name, when):
    """Write one message through put (which reports its own write errors)."""
    from qmailpy.local.mbox import is_from
    try:
        # O_NONBLOCK as qmail's open_read: a FIFO reads as empty, never blocks the move
        with open(os.open(name, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            line = f.readline()
            put(from_line(line, line.endswith(b"\n"), when))
            while line:
                if is_from(line):
                    put(b">")
                put(line)
                if not line.endswith(b"\n"):
                    put(b"\n")
                    break
                line = f.readline()
    except OSError as e:
        raise _sys("unable to read $MAILDIR/" + name, e) from e
    put(b"\n")


def convert(mbox, mboxtmp):
    import fcntl
    now = int(time.time())
    clean_tmp(now)
    messages = scan(now)
    if not messages:
        return
    try:
        lockfd = os.open(mbox, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fcntl.flock(lockfd, fcntl.LOCK_EX)
    except OSError as e:
        raise _sys("unable to lock " + mbox, e) from e
    try:
        try:
            old = open(mbox, "rb")
        except OSError as e:
            raise _sys("unable to read " + mbox, e) from e
        with old:
            try:
                new = open(mboxtmp, "wb")
            except OSError as e:
                raise _sys("unable to create " + mboxtmp, e) from e
            with new:
                _copy(old, new, mbox, mboxtmp)
                def put(data):
                    try:
                        new.write(data)
                    except OSError as e:
                        raise _sys("unable to write to " + mboxtmp, e) from e
                for when, name in messages:
                    append_message(put, name, when)
                try:
                    new.flush()
                    os.fsync(new.fileno())
                except OSError as e:
                    raise _sys("unable to write to " + mboxtmp, e) from e
        try:
            os.rename(mboxtmp, mbox)
        except OSError as e:
            raise _sys("unable to move %s to %s" % (mboxtmp, mbox), e) from e
    finally:
        os.close(lockfd)
    for when, name in messages:
        try:
            os.unlink(name)
        except OSError as e:
            from qmailpy.local.errors import error_str
            sys.stderr.write("%s$MAILDIR/%s will be delivered twice; unable to unlink: %s\n"
                             % (WARNING, name, error_str(e).decode()))


def _copy(old, new, mbox, mboxtmp):
    while True:
        try:
            chunk = old.read(65536)
        except OSError as e:
            raise _sys("unable to read " + mbox, e) from e
        if not chunk:
            return
        try:
            new.write(chunk)
        except OSError as e:
            raise _sys("unable to write to " + mboxtmp, e) from e


def main(argv=None):
    os.umask(0o077)
    try:
        mbox = os.environ.get("MAIL")
        if mbox is None:
            raise Fatal("MAIL not set")
        mboxtmp = os.environ.get("MAILTMP")
        if mboxtmp is None:
            raise Fatal("MAILTMP not set")
        maildir = os.environ.get("MAILDIR")
        if maildir is None:
            raise Fatal("MAILDIR not set")
        try:
            os.chdir(maildir)
        except OSError as e:
            raise _sys("unable to chdir to " + maildir, e) from e
        convert(mbox, mboxtmp)
    except Fatal as e:
        sys.stderr.write(FATAL + str(e) + "\n")
        return 111
    return 0


if __name__ == "__main__":
    sys.exit(main())
