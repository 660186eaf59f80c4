"""Working as root inside directories another account can write (docs/security.md "Root and other accounts' directories").

A path through such a directory is the other account's to redirect: between
root's check and root's act it can become a symlink, a FIFO or a hard link to
someone else's file. So root opens each component relative to its parent's
descriptor with O_NOFOLLOW, and changes what it opened through the descriptor
(fchmod, fchown, fstat), never through the name again. The one symlink followed
is one only root could have made: owned by root, in a directory owned by root
that nobody else can write (an administrator's /var/qmail/queue -> /big/queue).
"""
import errno
import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in place of a file must not wait for a writer
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


_KINDS = {stat.S_IFREG: "a regular file", stat.S_IFIFO: "a named pipe", stat.S_IFDIR: "a directory",
          stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


class Refused(OSError):
    """A name that is not what root may work on (a symlink, a FIFO, a linked file);
    str() says which name and why."""

    def __init__(self, name, why):
        super().__init__("%s: %s: refused" % (name, why))
        self.name, self.why = name, why


def _root_made(parent_fd, name):
    """Whether the symlink name in parent_fd could only have been made by root."""
    parent = os.fstat(parent_fd)
    link = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    return parent.st_uid == 0 and not parent.st_mode & 0o022 and link.st_uid == 0


MAX_LINKS = 8           # root's own symlinks followed in one lookup, as the kernel's ELOOP limit


def open_dir(name, parent_fd=None, links=0):
    """A descriptor of the directory name (relative to parent_fd when given), not
    reached through a symlink someone other than root could have planted. A link
    only root could have made is followed, its target walked by the same rules: a
    directory on its way may be another account's (queue -> /data/queue, /data qmailq's)."""
    try:
        return os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            raise Refused(name, "not a directory") from None
        if parent_fd is None or not _root_made(parent_fd, name):
            raise Refused(name, "a symbolic link") from None
        if links >= MAX_LINKS:
            raise Refused(name, "too many symbolic links") from None
        target = os.readlink(name, dir_fd=parent_fd)
        start = os.open("/" if target.startswith("/") else ".", DIR_FLAGS,
                        dir_fd=None if target.startswith("/") else parent_fd)
        return _walk(start, target, named="/" if target.startswith("/") else None, links=links + 1)


def open_home(home):
    """A descriptor of the directory home. As root, home and every directory above it
    are opened from / by open_dir: whoever owns the directory above a single-user home
    could otherwise swap the home for a symlink to /etc, which root's init then chowns
    to them. Another account is held back by its own rights and opens home as given."""
    if os.geteuid() != 0:
        return os.open(home, DIR_FLAGS)
    return _walk(os.open("/", DIR_FLAGS), os.path.abspath(home), named="/")


def open_path(home, rel):
    """A descriptor of the directory home/rel: home by open_home, each component of
    rel by open_dir."""
    return _walk(open_home(home), rel)


def _walk(fd, rel, named=None, links=None):
    """The directory rel below the open directory fd (which it takes over), each
    component by open_dir; with named (fd's path), a refusal names the whole path.
    links: the target of a root-made symlink, followed that many links deep, in
    which '..' (never itself a link) is allowed."""
    try:
        for part in rel.split(os.sep):
            if part in ("", "."):
                continue
            if part == "..":
                if links is None:
                    raise Refused(rel, "'..' in the path")
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                continue
            try:
                child = open_dir(part, fd, links or 0)
            except Refused as e:
                if named is None or e.name != part:         # not this name (a link's target's)
                    raise
                raise Refused(os.path.join(named, part), e.why) from None
            named = named and os.path.join(named, part)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(name, dir_fd, flags=os.O_RDONLY, kind=stat.S_IFREG, mode=0o600):
    """os.open of name in dir_fd without following a symlink or waiting on a FIFO;
    what it opened must be of kind (S_IFREG: a regular file, S_IFIFO: a named pipe)
    with one link, else Refused. O_NONBLOCK stays set on a FIFO and is cleared on
    a regular file. O_TRUNC truncates only after the checks: open(2) would cut a
    hard-linked file before fstat could refuse it."""
    try:
        fd = os.open(name, (flags & ~os.O_TRUNC) | FILE_FLAGS, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(name, "a symbolic link") from None
        if e.errno == errno.ENXIO:                  # a FIFO opened to write, no reader
            raise Refused(name, "a named pipe, not a file") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_IFMT(st.st_mode) != kind:
            raise Refused(name, "%s, not %s" % (_KINDS.get(stat.S_IFMT(st.st_mode), "a device"),
                                                _KINDS[kind]))
        if st.st_nlink != 1:        # a FIFO too: root fchowns lock/trigger to qmailq
            raise Refused(name, "%s with %d links" % ("a file" if kind == stat.S_IFREG else _KINDS[kind],
                                                       st.st_nlink))
        if kind == stat.S_IFREG:
            os.set_blocking(fd, True)
            if flags & os.O_TRUNC:
                os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace(dir_fd, name, data, mode, owner=None, sync=False):
    """name in dir_fd holds data whole or not at all: written as a fresh NAME.tmp (a name
    planted there is unlinked first, never written through: O_EXCL|O_NOFOLLOW), fsynced
    when asked, fchowned to owner (uid, gid) when given, fchmodded, renamed by descriptor."""
    from qmailpy.fileio import write_all
    tmp = name + ".tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)             # after fchown, which clears setgid bits
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
