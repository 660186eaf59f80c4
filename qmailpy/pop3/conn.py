"""The line I/O qmail-popup and qmail-pop3d share: commands read from fd 0, replies
written to fd 1, each read and write given TIMEOUT seconds (qmail's 1200), after which
the program ends as it would on a closed connection."""
import os
import select
import signal

TIMEOUT = 1200
# qmail reads a command line of any length; a longer one is answered as a syntax
# error here and the rest of it skipped, so a client cannot fill the memory.
MAX_LINE = 1024


class Closed(Exception):
    """The client went away, or a read or write took longer than the timeout."""


def _expired(signum, frame):
    raise Closed()


class Conn:
    def __init__(self, rfd=0, wfd=1, timeout=TIMEOUT):
        self.rfd, self.wfd, self.timeout = rfd, wfd, timeout
        self._in = b""
        self._out = []
        self._outlen = 0

    def _wait(self, fd, event):
        poller = select.poll()
        poller.register(fd, event)
        if not poller.poll(self.timeout * 1000):
            raise Closed()

    def command(self):
        """(verb in lower case, argument) of the next line, as qmail's commands() splits it:
        the verb ends at the first space, the argument starts after the spaces that follow;
        a CR before the LF is dropped. A line over MAX_LINE gives verb None."""
        too_long = False
        while True:
            end = self._in.find(b"\n")
            if end >= 0:
                line, self._in = self._in[:end], self._in[end + 1:]
                break
            if len(self._in) > MAX_LINE:
                self._in = b""
                too_long = True
            self._wait(self.rfd, select.POLLIN)
            try:
                data = os.read(self.rfd, 4096)
            except OSError:
                raise Closed() from None
            if not data:
                raise Closed()
            self._in += data
        if too_long or len(line) > MAX_LINE:
            return None, b""
        if line.endswith(b"\r"):
            line = line[:-1]
        verb, _, arg = line.partition(b" ")
        return verb.lower(), arg.lstrip(b" ")

    def discard_pending(self):
        """Forget what the client sent after the last command line (pipelined ahead)."""
        self._in = b""

    def serve(self, session, commands, unknown):
        """qmail's commands(): each line to commands[verb](session, arg), an unknown verb
        answered "-ERR " + unknown, a line too long "-ERR syntax error"; until Closed."""
        while True:
            verb, arg = self.command()
            handler = commands.get(verb)
            if handler is None:
                self.err(b"syntax error" if verb is None else unknown)
            else:
                handler(session, arg)

    def put(self, data):
        self._out.append(data)
        self._outlen += len(data)
        if self._outlen >= 65536:
            self.flush()

    def flush(self):
        data = b"".join(self._out)
        self._out, self._outlen = [], 0
        view = memoryview(data)
        # A blocking write waits until all of it is taken, however long a client that
        # stopped reading takes: the alarm (qmail's timeoutwrite) bounds it too.
        previous = signal.signal(signal.SIGALRM, _expired)
        try:
            while view:
                self._wait(self.wfd, select.POLLOUT)
                signal.alarm(self.timeout)
                try:
                    n = os.write(self.wfd, view)
                except OSError:
                    raise Closed() from None
                finally:
                    signal.alarm(0)
                view = view[n:]
        finally:
            signal.signal(signal.SIGALRM, previous)

    def reply(self, data):
        self.put(data)
        self.flush()

    def err(self, text):
        self.reply(b"-ERR " + text + b"\r\n")

    def okay(self):
        self.reply(b"+OK \r\n")
