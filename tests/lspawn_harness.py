"""Local users and the qmail-lspawn pipe protocol for the test_local_* and test_lspawn* files.

LocalUsers(qmail_home) adds users to users/assign with their own home
directories (owned by the fixture's account, which every role of the test
home uses), writes .qmail files and mess files, and runs qmail-lspawn with
real commands on its fd 0, returning the replies it wrote on fd 1.
"""
import os
import shutil
import subprocess

from qmailpy import spawn

AS_ROOT = os.geteuid() == 0


class LocalUsers:
    def __init__(self, qh):
        self.qh = qh
        self.base = os.path.join(os.path.dirname(qh.path), "homes")
        os.makedirs(self.base, exist_ok=True)
        os.chmod(self.base, 0o755)
        self.assign = []                # users/assign lines without the final '.'
        self._next_mess = 1000

    # --- files owned by the test account ---------------------------------
    def own(self, path):
        if AS_ROOT:
            os.chown(path, self.qh.uid, self.qh.gid, follow_symlinks=False)

    def write(self, path, data, mode=0o644):
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        os.chmod(path, mode)
        self.own(path)
        return path

    def mkdir(self, path, mode=0o755):
        os.mkdir(path)
        os.chmod(path, mode)
        self.own(path)
        return path

    def maildir(self, path):
        self.mkdir(path, 0o700)
        for sub in ("tmp", "new", "cur"):
            self.mkdir(os.path.join(path, sub), 0o700)
        return path

    # --- users ------------------------------------------------------------
    def add(self, name, uid=None, gid=None, home=None, dash="", ext="", wildcard=False,
            maildir=True):
        """Add a user (`=name:...` or `+name:...`) with a home (made unless given); its path."""
        if home is None:
            home = self.mkdir(os.path.join(self.base, name.strip("-") or "star"))
            if maildir:
                self.maildir(os.path.join(home, "Maildir"))
        uid = self.qh.uid if uid is None else uid
        gid = self.qh.gid if gid is None else gid
        self.assign.append("%s%s:%s:%d:%d:%s:%s:%s:" % (
            "+" if wildcard else "=", name, self.qh.user, uid, gid, home, dash, ext))
        self.save()
        return home

    def save(self):
        path = os.path.join(self.qh.path, "users", "assign")
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in self.assign) + ".\n")
        os.chmod(path, 0o644)

    def dotqmail(self, home, suffix, text, mode=0o644):
        return self.write(os.path.join(home, ".qmail" + suffix), text, mode)

    # --- messages and the spawner -----------------------------------------
    def mess(self, data):
        """A message file in queue/mess as qmail-queue leaves it; its path relative to mess/."""
        n = self._next_mess
        self._next_mess += 1
        rel = "%d/%d" % (n % 23, n)
        path = os.path.join(self.qh.queue, "mess", rel)
        self.write(path, data, 0o640)
        return rel.encode()

    def command(self, slot, mess, sender, recipient):
        return spawn.encode_command(slot, mess, sender, recipient)

    def start(self, commands, defaultdelivery="./Maildir/", env=None):
        """qmail-lspawn running with the commands written and its fd 0 closed.

        The program is found on the home's PATH, so env may name any PATH."""
        program = shutil.which("qmail-lspawn", path=self.qh.env["PATH"])
        proc = subprocess.Popen([program, defaultdelivery], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or self.qh.env)
        proc.stdin.write(b"".join(commands))
        proc.stdin.close()
        proc.stdin = None               # closed: communicate() must not flush it
        return proc

    def wait_greeting(self, proc):
        """Read qmail-lspawn's greeting byte: from then on it runs its own program."""
        greeting = os.read(proc.stdout.fileno(), 1)
        assert greeting == bytes((spawn.SLOTS,)), greeting
        proc.greeted = True

    def finish(self, proc):
        """{slot: (letter, text)} once qmail-lspawn has answered everything and exited 0."""
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        if getattr(proc, "greeted", False):
            out = bytes((spawn.SLOTS,)) + out
        assert out[:1] == bytes((spawn.SLOTS,)), out
        replies = spawn.ReplyReader().feed(out[1:])
        return {slot: (letter, text) for slot, letter, text in replies}

    def deliver(self, recipient, message=b"Subject: test\n\nhello\n", sender=b"joe@example.org",
                defaultdelivery="./Maildir/"):
        """One delivery through qmail-lspawn: (letter, text)."""
        mess = self.mess(message)
        proc = self.start([self.command(0, mess, sender, recipient)], defaultdelivery)
        return self.finish(proc)[0]


def maildir_files(path):
    """{name: bytes} of the messages in path/new (asserting tmp/ is empty)."""
    assert os.listdir(os.path.join(path, "tmp")) == []
    found = {}
    for name in os.listdir(os.path.join(path, "new")):
        with open(os.path.join(path, "new", name), "rb") as f:
            found[name] = f.read()
    return found
