"""SMTP connections a qmail-rspawn delivery worker keeps open between transactions.

qmail-remote makes one connection per message, which is what makes qmail slow at
bulk remote mail. A delivery worker (qmailpy.remote.workerpool) keeps the
connection of a transaction the peer accepted, keyed by the address, port and
TLS policy it was made under, and the next message for that address starts with
RSET on it instead of a new connection, greeting, EHLO and TLS handshake, as
Postfix's connection cache does. A connection is kept at most IDLE seconds
without use (the peer's slot is not held longer than that) and used for new
transactions for at most AGE seconds after it was opened; then it is closed
with QUIT.
"""
import time

IDLE = 2            # Postfix's smtp_connection_cache_time_limit
AGE = 300           # Postfix's smtp_connection_reuse_time_limit


class Connections:
    def __init__(self, idle=IDLE, age=AGE):
        self.idle, self.age = idle, age
        self.held = {}          # key -> (Connection, extensions, last used)

    def keeper(self, key):
        """keep(conn, extensions) for smtp.dialogue: hold conn under key."""
        def keep(conn, extensions):
            if getattr(conn, "opened", None) is None:
                conn.opened = time.monotonic()
            old = self.held.pop(key, None)
            if old is not None and old[0] is not conn:
                _quit(old[0])
            self.held[key] = (conn, extensions, time.monotonic())
        return keep

    def take(self, key):
        """(conn, extensions) of a connection held under key, no longer held; or None."""
        self.expire()
        held = self.held.pop(key, None)
        return None if held is None else held[:2]

    def wait(self):
        """Seconds until the next held connection must be closed; None when none is held."""
        if not self.held:
            return None
        return max(0.0, min(self._ends(entry) for entry in self.held.values()) - time.monotonic())

    def expire(self):
        now = time.monotonic()
        for key, entry in list(self.held.items()):
            if self._ends(entry) <= now:
                del self.held[key]
                _quit(entry[0])

    def close(self):
        for entry in self.held.values():
            _quit(entry[0])
        self.held.clear()

    def _ends(self, entry):
        conn, _, used = entry
        return min(used + self.idle, conn.opened + self.age)


def _quit(conn):
    conn.deadline = None
    try:
        conn.write(b"QUIT\r\n")
    except Exception:           # a peer already gone; closing is all that is left
        pass
    conn.close()
