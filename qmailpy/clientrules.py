"""A daemon's client rules file (control/smtpclients, control/qmqpclients): tcprules' source
format (qmailpy.util.tcprules), reread when it changes, shared by qmail-smtpd-listen and
qmail-qmqpd.

The file is reread when its inode, size or mtime changes, so checking it costs one
stat per connection. An absent file means no rules.
"""
import os

from qmailpy.util.tcprules import lookup, parse_rules


class Rules:
    def __init__(self, path):
        self.path = path
        self.signature = None
        self.table = {}

    def refresh(self):
        """Reread the file if it changed; an error text (old rules kept) or None."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            signature = None
        except OSError as e:
            return self._failed(("stat", e.errno), "unable to stat %s: %s" % (self.path, e.strerror))
        else:
            signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self.signature:
            return None
        if signature is None:
            self.signature, self.table = None, {}
            return None
        # as control/ files are read (qmailpy.home): qmail-smtpd-listen reads it as root, and
        # a single-user home's user could link it to /etc/shadow, whose first line the parse
        # error below would then quote in the user's log
        from qmailpy.home import ControlError, control_bytes
        try:
            data = control_bytes(self.path, self.path)
            table = parse_rules((data or b"").decode("utf-8", "surrogateescape"))
        except ControlError as e:
            return self._failed(signature, str(e))
        except ValueError as e:
            return self._failed(signature, "unable to parse %s: %s" % (self.path, e))
        self.signature, self.table = signature, table
        return None

    def _failed(self, signature, text):
        # Report a broken file once, not on every connection, until it changes again.
        if signature == self.signature:
            return None
        self.signature = signature
        return text

    def lookup(self, ip):
        """(allow, ((name, value), ...)) for a client address."""
        return lookup(self.table, ip)
