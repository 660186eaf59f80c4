"""qmail-pop3d: the POP3 transaction state on a Maildir (qmail-pop3d(8)).

As qmail's: the messages are those in new/ and cur/ at the start, oldest first;
STAT counts every message but sums only the sizes of those not deleted; a size is
the file's size (LF line ends); UIDL is the name without its :2,... info; DELE only
marks, QUIT unlinks the marked messages and moves the others from new/ to cur/
(adding ":2,"); a session that ends any other way changes nothing. A message is
sent as its lines with CRLF, a line starting with "." doubled, then an empty line
and ".". LAST is the highest message number deleted.

Beyond qmail: a message another session has meanwhile moved from new/ to cur/
is still found (RETR/TOP) and removed (QUIT), and one it has removed already counts
as removed rather than as "unable to unlink".
"""
import os
import time

from qmailpy.pop3.conn import Closed, Conn

# maildir_clean: files in tmp/ not accessed for this long are an interrupted delivery's
TMP_AGE = 36 * 3600
LINE_PIECE = 65536
NOMAILDIR = b"this user has no $HOME/Maildir"
SCAN = b"unable to scan $HOME/Maildir"
ROOT = b"qmail-pop3d invoked as uid 0, terminating\n"


class Message:
    __slots__ = ("name", "size", "deleted")

    def __init__(self, name, size):
        self.name, self.size, self.deleted = name, size, False

    def uid(self):
        return self.name[4:].split(b":", 1)[0]

    def moved_name(self):
        """Where QUIT (ours or another session's) moves a message found in new/."""
        return b"cur/" + self.name[4:] + b":2,"


def clean_tmp(now):
    try:
        names = os.listdir(b"tmp")
    except OSError:
        return
    for name in names:
        path = b"tmp/" + name
        try:
            st = os.stat(path)
            if now > st.st_atime + TMP_AGE:
                os.unlink(path)
        except OSError:
            pass


def scan():
    """The messages in new/ and cur/, oldest (by mtime) first."""
    found = []
    for sub in (b"new/", b"cur/"):
        for name in os.listdir(sub):
            if name.startswith(b"."):
                continue
            try:
                st = os.stat(sub + name)
            except FileNotFoundError:
                continue
            found.append((st.st_mtime, sub + name, st.st_size))
    found.sort()
    return [Message(name, size) for _, name, size in found]


def _alternatives(message):
    if message.name.startswith(b"new/"):
        return (message.name, message.moved_name())
    return (message.name,)


class Session:
    def __init__(self, conn, messages):
        self.conn = conn
        self.messages = messages
        self.last = 0

    def msgno(self, arg):
        """The index arg names (its leading digits, as qmail's scan_ulong reads them), or
        None after the error reply."""
        digits = len(arg) - len(arg.lstrip(b"0123456789"))
        if not digits:
            self.conn.err(b"syntax error")
            return None
        number = int(arg[:digits])
        if number == 0:
            self.conn.err(b"messages are counted from 1")
            return None
        if number > len(self.messages):
            self.conn.err(b"not that many messages")
            return None
        if self.messages[number - 1].deleted:
            self.conn.err(b"already deleted")
            return None
        return number - 1

    def stat(self, arg):
        total = sum(m.size for m in self.messages if not m.deleted)
        self.conn.reply(b"+OK %d %d\r\n" % (len(self.messages), total))

    def rset(self, arg):
        for m in self.messages:
            m.deleted = False
        self.last = 0
        self.conn.okay()

    def last_(self, arg):
        self.conn.reply(b"+OK %d\r\n" % self.last)

    def dele(self, arg):
        i = self.msgno(arg)
        if i is None:
            return
        self.messages[i].deleted = True
        self.last = max(self.last, i + 1)
        self.conn.okay()

    def _listing(self, arg, field):
        if arg:
            i = self.msgno(arg)
            if i is None:
                return
            self.conn.reply(b"+OK %d %s\r\n" % (i + 1, field(self.messages[i])))
            return
        self.conn.put(b"+OK \r\n")
        for i, m in enumerate(self.messages):
            if not m.deleted:
                self.conn.put(b"%d %s\r\n" % (i + 1, field(m)))
        self.conn.reply(b".\r\n")

    def list(self, arg):
        self._listing(arg, lambda m: b"%d" % m.size)

    def uidl(self, arg):
        self._listing(arg, Message.uid)

    def top(self, arg):
        """RETR n, and TOP n lines: the headers, then at most lines lines of the body."""
        i = self.msgno(arg)
        if i is None:
            return
        rest = arg.lstrip(b"0123456789").lstrip(b" ")
        digits = len(rest) - len(rest.lstrip(b"0123456789"))
        limit = int(rest[:digits]) + 1 if digits else 0
        f = None
        for name in _alternatives(self.messages[i]):
            try:
                # O_NONBLOCK as qmail's open_read: a FIFO in the Maildir reads as empty
                # instead of holding the session in open() for good
                f = open(os.open(name, os.O_RDONLY | os.O_NONBLOCK), "rb")
                break
            except OSError:
                continue
        if f is None:
            self.conn.err(b"unable to open that message")
            return
        with f:
            self.conn.put(b"+OK \r\n")
            self._blast(f, limit)

    def _blast(self, f, limit):
        """qmail's blast(), reading a line in pieces of at most LINE_PIECE bytes so that
        a message with no line ends is not held whole."""
        put = self.conn.put
        in_headers = True
        at_start = True             # the next piece begins a line
        while True:
            piece = f.readline(LINE_PIECE)
            if not piece:
                break
            ends = piece.endswith(b"\n")
            if ends:
                piece = piece[:-1]
            if at_start:
                if limit and not in_headers:
                    limit -= 1
                    if not limit:
                        break
                if not piece and ends:
                    in_headers = False
                elif piece[:1] == b".":
                    put(b".")
            put(piece)
            if ends:
                put(b"\r\n")
            at_start = ends
        if not at_start:            # the last line had no LF
            put(b"\r\n")
        self.conn.reply(b"\r\n.\r\n")

    def quit(self, arg):
        for m in self.messages:
            if m.deleted:
                if not self._unlink(m):
                    self.conn.err(b"unable to unlink all deleted messages")
            elif m.name.startswith(b"new/"):
                try:
                    os.rename(m.name, m.moved_name())
                except OSError:
                    pass
        self.conn.okay()
        raise Closed()

    def _unlink(self, m):
        for name in _alternatives(m):
            try:
                os.unlink(name)
                return True
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True         # another session removed it already

    def noop(self, arg):
        self.conn.okay()

    COMMANDS = {b"quit": quit, b"stat": stat, b"list": list, b"uidl": uidl, b"dele": dele,
                b"retr": top, b"rset": rset, b"last": last_, b"top": top, b"noop": noop}

    def run(self):
        self.conn.okay()
        self.conn.serve(self, self.COMMANDS, b"unimplemented")


def main(argv):
    if os.getuid() == 0 or os.geteuid() == 0:
        os.write(2, ROOT)
        return 1
    conn = Conn()
    try:
        try:
            if not argv or not argv[0]:
                raise FileNotFoundError()
            os.chdir(argv[0])
        except OSError:
            conn.err(NOMAILDIR)
            return 0
        clean_tmp(time.time())
        try:
            messages = scan()
        except OSError:
            conn.err(SCAN)
            return 0
        Session(conn, messages).run()
    except Closed:
        pass
    return 0
