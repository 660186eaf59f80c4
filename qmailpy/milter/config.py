"""control/milters (docs/control-files.md, docs/milter.md "control/milters").

One milter a line, in the order they run:

    unix:/path/to/socket [default=tempfail|accept] [connect=S] [command=S] [data=S]
    inet:host:port ...          (host a name, an IPv4 address or [an IPv6 address])

default: what the session does when this milter cannot be reached, times out or breaks
the protocol: tempfail (451, the default, as Postfix's milter_default_action) or accept
(go on without it for the rest of the session). Timeouts in seconds, as Postfix's
milter_connect_timeout, milter_command_timeout and milter_content_timeout: connect
(default 30), command (each reply before DATA, default 30), data (each reply to
the message's headers, body and end, default 300).
"""
from qmailpy.home import ControlError, control_list

CONTROL = "milters"
DEFAULTS = ("tempfail", "accept")
TIMEOUTS = {"connect": 30, "command": 30, "data": 300}


class Milter:
    __slots__ = ("name", "family", "address", "default", "connect_timeout", "command_timeout",
                 "data_timeout")


def parse_line(line):
    """A Milter from one line (bytes); ControlError on a bad one."""
    text = line.decode("utf-8", "replace")
    words = text.split()

    def bad(why):
        return ControlError("control/%s: %r: %s" % (CONTROL, text, why))

    m = Milter()
    m.name = words[0]
    kind, _, where = m.name.partition(":")
    if kind == "unix" and where.startswith("/"):
        m.family, m.address = "unix", where
    elif kind == "inet":
        host, _, port = where.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise bad("not inet:host:port")
        m.family, m.address = "inet", (host, int(port))
    else:
        raise bad("not unix:/path or inet:host:port")
    m.default = DEFAULTS[0]
    timeouts = dict(TIMEOUTS)
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq:
            raise bad("%r is not key=value" % word)
        if key == "default":
            if value not in DEFAULTS:
                raise bad("default is tempfail or accept")
            m.default = value
        elif key in timeouts:
            try:
                seconds = float(value)
            except ValueError:
                seconds = 0
            if not seconds > 0:
                raise bad("%s is a number of seconds above 0" % key)
            timeouts[key] = seconds
        else:
            raise bad("unknown setting %r" % key)
    m.connect_timeout = timeouts["connect"]
    m.command_timeout = timeouts["command"]
    m.data_timeout = timeouts["data"]
    return m


def read(home):
    """The milters of control/milters, [] without the file; ControlError on a bad line."""
    return [parse_line(line) for line in control_list(home, CONTROL, [])]
