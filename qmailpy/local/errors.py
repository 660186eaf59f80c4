"""qmail-local's failures and qmail's wording of system errors.

A delivery step that fails raises Failure(exit code, text); qmail-local prints
the text and a newline on fd 2 and exits with the code (111 temporary, 100
permanent). error_str() and error_temp() are qmail's own error_str.c and
error_temp.c, so the texts in reports match C qmail's word for word.
"""
import errno


class Failure(Exception):
    """End the delivery: print text (bytes, no newline) and exit with code."""

    def __init__(self, code, text):
        super().__init__(code, text)
        self.code = code
        self.text = text


_STR = {
    0: "no error",
    errno.EINTR: "interrupted system call",
    errno.ENOMEM: "out of memory",
    errno.ENOENT: "file does not exist",
    errno.ETXTBSY: "text busy",
    errno.EIO: "input/output error",
    errno.EEXIST: "file already exists",
    errno.ETIMEDOUT: "timed out",
    errno.EINPROGRESS: "operation in progress",
    errno.EAGAIN: "temporary failure",
    errno.EPIPE: "broken pipe",
    errno.EPERM: "permission denied",
    errno.EACCES: "access denied",
    errno.ESRCH: "no such process",
    errno.ENXIO: "device not configured",
    errno.E2BIG: "argument list too long",
    errno.ENOEXEC: "exec format error",
    errno.EBADF: "file descriptor not open",
    errno.ECHILD: "no child processes",
    errno.EDEADLK: "operation would cause deadlock",
    errno.EFAULT: "bad address",
    errno.ENOTBLK: "not a block device",
    errno.EBUSY: "device busy",
    errno.EXDEV: "cross-device link",
    errno.ENODEV: "device does not support operation",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EINVAL: "invalid argument",
    errno.ENFILE: "system cannot open more files",
    errno.EMFILE: "process cannot open more files",
    errno.ENOTTY: "not a tty",
    errno.EFBIG: "file too big",
    errno.ENOSPC: "out of disk space",
    errno.ESPIPE: "unseekable descriptor",
    errno.EROFS: "read-only file system",
    errno.EMLINK: "too many links",
    errno.ELOOP: "symbolic link loop",
    errno.ENAMETOOLONG: "file name too long",
    errno.ENOTEMPTY: "directory not empty",
    errno.EUSERS: "too many users",
    errno.EDQUOT: "disk quota exceeded",
    errno.ESTALE: "stale NFS file handle",
    errno.ENOLCK: "no locks available",
    errno.ENOSYS: "system call not available",
}

_TEMP = frozenset((
    errno.EINTR, errno.ENOMEM, errno.ETXTBSY, errno.EIO, errno.ETIMEDOUT,
    errno.EWOULDBLOCK, errno.EAGAIN, errno.EDEADLK, errno.EBUSY, errno.ENFILE,
    errno.EMFILE, errno.EFBIG, errno.ENOSPC, errno.ENETDOWN, errno.ENETUNREACH,
    errno.ENETRESET, errno.ECONNABORTED, errno.ECONNRESET, errno.ENOBUFS,
    errno.ETOOMANYREFS, errno.ECONNREFUSED, errno.EHOSTDOWN, errno.EHOSTUNREACH,
    errno.EUSERS, errno.EDQUOT, errno.ESTALE, errno.ENOLCK,
))


def error_str(err):
    """qmail's text for an errno (an int, or an OSError)."""
    if isinstance(err, OSError):
        err = err.errno
    return _STR.get(err, "unknown error").encode()


def error_temp(err):
    """True when qmail treats this errno as a temporary condition."""
    if isinstance(err, OSError):
        err = err.errno
    return err in _TEMP
