"""qmail-inject's work: read a message, complete its header, queue it or print it.

inject() returns qmail-inject's exit status (0, 100 permanent, 111 temporary)
and writes "qmail-inject: fatal: ..." to err for every failure.
"""
import os

from qmailpy.inject.compose import DEFAULT, InjectError, compose

_CHUNK = 65536


class ClosedInput:
    """The message when the caller closed fd 0: a read error, as in qmail (whose
    qmail-inject fails to read), never an empty message sent to the recipients."""

    def read(self, size=-1):
        import errno
        raise OSError(errno.EBADF, "standard input is closed")

    readline = read


class Options:
    def __init__(self, strategy=DEFAULT, args=(), sender=None, name=None, queue=True):
        self.strategy = strategy
        self.args = [os.fsencode(a) for a in args]
        self.sender = None if sender is None else os.fsencode(sender)
        self.name = name
        self.queue = queue


def inject(home, options, environ, stdin, stdout, stderr, prog="qmail-inject"):
    try:
        _inject(home, options, environ, stdin, stdout)
    except InjectError as e:
        stderr.write(("%s: fatal: %s\n" % (prog, e)).encode("utf-8", "replace"))
        stderr.flush()
        return e.code
    return 0


def _inject(home, options, environ, stdin, stdout):
    from qmailpy.home import ControlError
    from qmailpy.inject.headers import read_header
    from qmailpy.inject.settings import InjectSettings
    try:
        settings = InjectSettings(home, environ, options.name)
    except (ControlError, OSError) as e:
        raise InjectError(111, "unable to read controls: %s" % e)
    try:
        header = read_header(stdin)
    except OSError as e:
        raise InjectError(111, "unable to read message: %s" % e.strerror)
    composed = compose(header, settings, options.strategy, options.args, options.sender)
    head = composed.header + header.separator + header.body_start

    if not options.queue:
        try:
            _copy(b"Return-Path: <" + composed.sender + b">\n" + head, stdin, stdout.write)
            stdout.flush()
        except OSError as e:
            raise InjectError(111, "unable to write output: %s" % e.strerror)
        return
    if not composed.recipients:
        raise InjectError(100, "no recipients: name them as arguments or in To/Cc/Bcc (-t)")
    from qmailpy.queue.client import QueueClient
    try:
        qq = QueueClient(home, environ)
    except OSError:
        raise InjectError(111, "unable to run qmail-queue")
    try:
        _copy(head, stdin, qq.write)
    except InjectError:
        qq.abort()
        raise
    result = qq.finish(composed.sender, composed.recipients)
    if not result.ok:
        raise InjectError(100 if result.permanent else 111,
                          result.text.decode("utf-8", "replace"))


def _copy(head, stdin, write):
    write(head)
    while True:
        try:
            chunk = stdin.read(_CHUNK)
        except OSError as e:
            raise InjectError(111, "unable to read message: %s" % e.strerror)
        if not chunk:
            return
        write(chunk)
