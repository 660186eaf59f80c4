"""qmail-pw2u: users/assign lines from a passwd file on stdin (qmail-pw2u(8)).

qmail's rules and output bytes: an account is skipped when its uid is 0, its
name has an uppercase letter (unless -u), it is not in users/include (when
that exists) or is in users/exclude, or its home directory does not exist
(-o, the default; -h stops with an error instead; -H checks nothing) or
belongs to another uid. Each remaining account gets ``=name:user:uid:gid:home:::``
and ``+name-:user:uid:gid:home:-::`` for each of its mail names (users/mailnames,
else its own name); the alias account (the home's alias role) also gets the
catch-all ``+:alias:uid:gid:home:-::``. Then users/subusers' ``sub:user:pre:``
lines, users/append verbatim, and the final ``.``. The users/ files are
QMAILHOME's. Exit 0; 100 for an unknown option; 111 for a fatal error.
"""
import errno
import os
import sys

FATAL = "qmail-pw2u: fatal: "


class Fatal(Exception):
    pass


class Options:
    dashcolon = b"-:"
    homestrategy = 2        # 2: skip a missing home; 1: stop at one; 0: do not look
    noupper = True
    brk = b"-"


def _read_list(home, name):
    """users/NAME as qmail's control_readfile reads it: None when absent."""
    from qmailpy.home import ControlError, control_list
    try:
        return control_list(home, "../" + name)       # HOME/control/../users/NAME
    except ControlError:
        raise Fatal("unable to read controls") from None


def _read_raw(home, name):
    try:
        with open(os.path.join(home, name), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError:
        raise Fatal("unable to read controls") from None


class Builder:
    def __init__(self, home, opts, alias_name):
        self.opts = opts
        self.alias_name = alias_name
        incl = _read_list(home, "users/include")
        excl = _read_list(home, "users/exclude")
        self.include = None if incl is None else set(incl)
        self.exclude = set(excl or ())
        self.mailnames = {}
        for line in _read_list(home, "users/mailnames") or ():
            key, _, rest = line.partition(b":")
            self.mailnames.setdefault(key, rest)
        self.users = {}             # name -> b":user:uid:gid:home:"
        self.saw_alias = False
        self.out = []

    def account(self, line):
        if b"\0" in line:
            return
        fields = line.split(b":")
        if len(fields) < 7:
            return
        user, uidstr, gidstr, home = fields[0], fields[2], fields[3], fields[5]
        digits = len(uidstr) - len(uidstr.lstrip(b"0123456789"))
        uid = int(uidstr[:digits]) if digits else 0
        if not uid:
            return
        if self.opts.noupper and any(65 <= c <= 90 for c in user):
            return
        if self.include is not None and user not in self.include:
            return
        if user in self.exclude:
            return
        if self.opts.homestrategy:
            try:
                st = os.stat(home)
            except OSError as e:
                if e.errno != errno.ENOENT or self.opts.homestrategy == 1:
                    raise Fatal("unable to stat %s" % os.fsdecode(home)) from None
                return
            if st.st_uid != uid:
                return
        uugh = b":" + user + b":" + uidstr + b":" + gidstr + b":" + home + b":"
        self.users.setdefault(user, uugh)
        if user == self.alias_name:
            self.out.append(b"+" + uugh + self.opts.dashcolon + b":\n")
            self.saw_alias = True
        names = self.mailnames.get(user, user)
        for name in names.split(b":"):
            if not name:
                continue
            self.out.append(b"=" + name + uugh + b"::\n")
            if self.opts.brk:
                self.out.append(b"+" + name + self.opts.brk + uugh + self.opts.dashcolon + b":\n")

    def subuser(self, line):
        fields = line.split(b":")
        if len(fields) < 3:
            return
        sub, user = fields[0], fields[1]
        uugh = self.users.get(user)
        if uugh is None:
            raise Fatal("unable to find %s user for subuser" % os.fsdecode(user))
        if len(fields) < 4:
            return
        pre = fields[2]
        self.out.append(b"=" + sub + uugh + self.opts.dashcolon + pre + b":\n")
        if self.opts.brk:
            self.out.append(b"+" + sub + self.opts.brk + uugh + self.opts.dashcolon + pre + b"-:\n")


def _lines(data):
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def pw2u(home, opts, passwd, alias_name):
    """The output (bytes) for a passwd file's bytes; Fatal on errors."""
    b = Builder(home, opts, alias_name)
    for line in _lines(passwd):
        b.account(line)
    if not b.saw_alias:
        raise Fatal("unable to find %s user" % os.fsdecode(alias_name))
    subusers = _read_raw(home, "users/subusers")
    for line in _lines(subusers or b""):
        b.subuser(line)
    append = _read_raw(home, "users/append")
    if append:
        b.out.append(append)
    b.out.append(b".\n")
    return b"".join(b.out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from qmailpy.util.sgetopt import GetoptError, sgetopt
    opts = Options()
    try:
        parsed, rest = sgetopt(argv, "/ohHuUc:C")
    except GetoptError:
        return 100
    for letter, value in parsed:
        if letter == "/":
            opts.dashcolon = b"-/:"
        elif letter in "ohH":
            opts.homestrategy = {"o": 2, "h": 1, "H": 0}[letter]
        elif letter in "uU":
            opts.noupper = letter == "U"
        elif letter == "c":
            opts.brk = os.fsencode(value)[:1]
        elif letter == "C":
            opts.brk = b""
    from qmailpy import privs
    from qmailpy.home import qmail_home
    home = qmail_home()
    if not os.path.isdir(home):
        sys.stderr.write(FATAL + "unable to chdir\n")
        return 111
    try:
        passwd = sys.stdin.buffer.read()
    except OSError:
        sys.stderr.write(FATAL + "unable to read input\n")
        return 111
    try:
        out = pw2u(home, opts, passwd, os.fsencode(privs.load_roles(home)["alias"]))
    except Fatal as e:
        sys.stderr.write(FATAL + str(e) + "\n")
        return 111
    try:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    except OSError:
        sys.stderr.write(FATAL + "unable to write output\n")
        return 111
    return 0


if __name__ == "__main__":
    sys.exit(main())
