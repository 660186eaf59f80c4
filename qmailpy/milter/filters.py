"""The milters of one qmail-smtpd session (docs/milter.md): each SMTP step shown to each
milter in the order of control/milters, their verdicts turned into SMTP replies,
their edits applied to the message on its way to the queue.

A step's answer is None (go on) or the reply to give. A milter that cannot be reached,
times out or breaks the protocol is dropped for the session; with default=tempfail
every later MAIL, RCPT and DATA of the session is answered 451 too (nothing is queued
unfiltered), with default=accept the session goes on without it.
"""
import os
import re
import struct
import time

from qmailpy.milter import protocol as p
from qmailpy.milter.message import Edits, Message, crlf_chunks

R_REJECT = b"550 sorry, a mail filter refuses this (#5.7.1)\r\n"
R_TEMPFAIL = b"451 a mail filter asks to try again later (#4.7.1)\r\n"
R_UNAVAILABLE = b"451 mail filter unavailable, try again later (#4.7.1)\r\n"
# a quarantine where the hold cannot reach the queue ($QMAILQUEUE, a mini-qmail home)
R_QUARANTINE = b"451 a mail filter asks for a quarantine, which this queue cannot hold (#4.7.1)\r\n"
R_SPOOL = b"451 qq write error or disk full (#4.3.0)\r\n"
R_NO_RECIPIENTS = b"554 a mail filter removed every recipient (#5.7.1)\r\n"
_REPLYCODE = re.compile(rb"[45][0-9][0-9]([ -]|$)")

_VERDICTS = {p.R_REJECT: R_REJECT, p.R_TEMPFAIL: R_TEMPFAIL}
DISCARD = object()          # a step's answer: take the message, queue nothing


class _Milter:
    def __init__(self, spec):
        self.spec = spec
        self.conn = None
        self.steps = 0
        self.actions = 0
        self.symlists = {}          # stage -> the macro names the milter asked for
        self.session_done = False   # accepted the connection, or dropped
        self.message_done = False   # accepted the message
        self.in_message = False     # got MAIL and no end of message or abort since


def _reply_code(data):
    """SMFIR_REPLYCODE's text as SMTP reply lines; MilterError when it is no 4xx/5xx reply."""
    lines = p.strings(data, 1)[0].split(b"\r\n")
    code = lines[0][:3]
    out = []
    for i, line in enumerate(lines):
        if not _REPLYCODE.match(line) or line[:3] != code or b"\n" in line or b"\r" in line:
            raise p.MilterError("a replycode that is no 4xx or 5xx reply: %r" % data[:80])
        out.append(code + (b" " if i == len(lines) - 1 else b"-") + line[4:] + b"\r\n")
    return b"".join(out)


class Milters:
    """info: bytes facts of the session: me, remoteip, remotehost, remoteport, localip, localport."""

    def __init__(self, specs, info, log):
        self.milters = [_Milter(spec) for spec in specs]
        self.info = info
        self.log = log
        self.unavailable = False    # a default=tempfail milter failed: 451 from now on
        self.refusal = None         # a milter refused the connection: every command's reply
        self.discard = False
        self.msg_id = b""
        self.count = 0
        self.macros = {}

    # -- the steps -----------------------------------------------------------
    def connect(self):
        info = self.info
        self.macros.update({
            b"j": info["me"], b"{daemon_name}": b"qmail-smtpd", b"v": b"qmailpy",
            b"{daemon_addr}": info["localip"], b"{daemon_port}": info["localport"],
            b"{client_addr}": info["remoteip"], b"{client_port}": info["remoteport"],
            b"{client_name}": info["remotehost"], b"{client_ptr}": info["remotehost"],
            b"_": b"%s [%s]" % (info["remotehost"], info["remoteip"])})
        for m in self.milters:
            try:
                self._open(m)
            except p.MilterError as e:
                self._fail(m, e)
        ip = info["remoteip"]
        family = b"6" if b":" in ip else b"4"
        port = int(info["remoteport"]) if info["remoteport"].isdigit() else 0
        host = info["remotehost"] if info["remotehost"] != b"unknown" else b"[%s]" % ip
        data = host + b"\0" + family + struct.pack(">H", port) + ip + b"\0"
        answer = self._step(p.STAGE_CONNECT, p.C_CONNECT, data, p.P_NOCONNECT, p.P_NR_CONN,
                            session=True)
        if answer is DISCARD:
            self.discard, answer = False, None
        self.refusal = answer
        return answer

    def helo(self, name, tls=None):
        if tls:
            self.macros[b"{tls_version}"], self.macros[b"{cipher}"] = tls
        answer = self._step(p.STAGE_HELO, p.C_HELO, name + b"\0", p.P_NOHELO, p.P_NR_HELO,
                            session=True)
        return None if answer is DISCARD else answer

    def mail(self, addr, params, authenticated):
        self.abort()
        if self.unavailable:
            return R_UNAVAILABLE
        self.count += 1
        self.msg_id = b"%X.%X.%d" % (int(time.time()), os.getpid(), self.count)
        for m in self.milters:
            m.message_done = False
        self.discard = False
        self.macros.update({b"i": self.msg_id, b"{mail_addr}": addr, b"{mail_mailer}": b"smtp",
                            b"{mail_host}": addr.rpartition(b"@")[2] if b"@" in addr else b""})
        if authenticated is not None:
            self.macros[b"{auth_authen}"] = authenticated
        data = b"<" + addr + b">\0" + b"".join(w + b"\0" for w in params.split())
        for m in self._live():
            m.in_message = True
        return self._message_step(p.STAGE_MAIL, p.C_MAIL, data, p.P_NOMAIL, p.P_NR_MAIL)

    def rcpt(self, addr):
        if self.unavailable:
            return R_UNAVAILABLE
        self.macros.update({b"{rcpt_addr}": addr, b"{rcpt_mailer}": b"smtp",
                            b"{rcpt_host}": addr.rpartition(b"@")[2] if b"@" in addr else b""})
        return self._message_step(p.STAGE_RCPT, p.C_RCPT, b"<" + addr + b">\0", p.P_NORCPT,
                                  p.P_NR_RCPT)

    def data(self):
        if self.unavailable:
            return R_UNAVAILABLE
        return self._message_step(p.STAGE_DATA, p.C_DATA, b"", p.P_NODATA, p.P_NR_DATA)

    def _message_step(self, *args):
        if self.discard:
            return None
        answer = self._step(*args)
        if answer is DISCARD:
            self.discard, answer = True, None
        return answer

    def end_of_data(self, spool, sender, recipients, queue):
        """The answer to the message in spool: milters see it, edits go in, queue(write,
        sender, recipients, hold) queues it (write(sink) puts the message out; hold: on hold,
        a milter's quarantine) and gives the reply."""
        try:
            if self.unavailable:
                return R_UNAVAILABLE
            return self._end_of_data(spool, sender, recipients, queue)
        except OSError as e:        # the spool could not be written or read back
            self.log(b"milter: message %s: %s" % (self.msg_id, str(e).encode()))
            return R_SPOOL
        finally:
            self.abort()            # those that did not see the end of this message

    def _end_of_data(self, spool, sender, recipients, queue):
        if spool.error is not None:
            raise spool.error
        message = Message(spool)
        edits = Edits(message, sender, recipients)
        try:
            for m in self._live():
                if self.discard:
                    break
                answer = self._filter(m, message, edits)
                if answer is DISCARD:
                    self.discard = True
                elif answer is not None:
                    return answer
            if self.discard:
                self.log(b"milter: discarded message %s" % self.msg_id)
                return b"250 ok %d qp 0\r\n" % int(time.time())
            if not edits.recipients:
                return R_NO_RECIPIENTS
            reply = queue(edits.write, edits.sender, edits.recipients, edits.quarantine)
            if edits.quarantine and reply[:4] == b"250 ":
                self.log(b"milter: message %s queued on hold: %s" % (self.msg_id, reply[4:].rstrip()))
            return reply
        finally:
            edits.close()

    def abort(self):
        """The transaction ended before its end of message (RSET, a new MAIL, a refused DATA)."""
        for m in self.milters:
            if m.in_message and m.conn is not None and not m.session_done:
                try:
                    m.conn.send(p.C_ABORT)
                except p.MilterError as e:
                    self._fail(m, e)
            m.in_message = False

    def close(self):
        for m in self.milters:
            if m.conn is not None:
                m.conn.close()
                m.conn = None

    # -- the machinery --------------------------------------------------------
    def _open(self, m):
        m.conn = p.Connection(m.spec)
        m.conn.send(p.C_OPTNEG, struct.pack(">III", p.VERSION, p.OFFERED_ACTIONS, p.OFFERED_STEPS))
        code, data = m.conn.reply(m.spec.command_timeout)
        if code != p.R_OPTNEG or len(data) < 12:
            raise p.MilterError("%s: no option negotiation" % m.spec.name)
        version, actions, steps = struct.unpack(">III", data[:12])
        if version < 2:
            raise p.MilterError("%s: speaks milter version %d" % (m.spec.name, version))
        # what was not offered is not granted, as Postfix does (rspamd asks for every action)
        m.actions, m.steps = actions & p.OFFERED_ACTIONS, steps & p.OFFERED_STEPS
        rest = data[12:]
        while len(rest) >= 4:
            stage = struct.unpack(">I", rest[:4])[0]
            names, nul, rest = rest[4:].partition(b"\0")
            if not nul:
                raise p.MilterError("%s: a macro list without its NUL" % m.spec.name)
            m.symlists[stage] = set(names.split())

    def _live(self):
        return [m for m in self.milters if not m.session_done and not m.message_done]

    def _fail(self, m, error):
        """Drop the milter; the reply its default action gives (None for accept)."""
        self.log(b"milter: %s, default %s" % (str(error).encode(), m.spec.default.encode()))
        if m.conn is not None:
            m.conn.close(polite=False)
            m.conn = None
        m.session_done = True
        if m.spec.default == "accept":
            return None
        self.unavailable = True
        return R_UNAVAILABLE

    def _send_macros(self, m, stage, command):
        wanted = m.symlists.get(stage)
        pairs = [(k, v) for k, v in self.macros.items()
                 if (wanted is None and k in _STAGE_MACROS[stage]) or (wanted and k in wanted)]
        if pairs:
            m.conn.queue(p.C_MACRO, p.macros(command, pairs))    # goes with its command

    def _step(self, stage, command, data, skip, no_reply, session=False):
        for m in self._live():
            if m.steps & skip:
                continue
            try:
                self._send_macros(m, stage, command)
                m.conn.send(command, data)
                if m.steps & no_reply:
                    continue
                answer = self._verdict(m, *m.conn.reply(m.spec.command_timeout), session)
            except p.MilterError as e:
                answer = self._fail(m, e)
            if answer is not None:
                return answer
        return None

    def _verdict(self, m, code, data, session=False):
        if code == p.R_CONTINUE:
            return None
        if code == p.R_ACCEPT:
            if session:
                m.session_done = True
            else:
                m.message_done = True
            return None
        if code == p.R_DISCARD:
            return DISCARD
        if code in _VERDICTS:
            return _VERDICTS[code]
        if code == p.R_REPLYCODE:
            return _reply_code(data)
        raise p.MilterError("%s: reply %r where a verdict belongs" % (m.spec.name, code))

    def _filter(self, m, message, edits):
        """One milter's look at the whole message: headers, body, end; its edits into edits."""
        timeout = m.spec.data_timeout
        try:
            leadspc = bool(m.steps & p.P_HDR_LEADSPC)
            if not m.steps & p.P_NOHDRS:
                for name, value in message.headers:
                    shown = value if leadspc else value.lstrip(b" \t")
                    answer = self._send(m, p.STAGE_EOH, p.C_HEADER, name + b"\0" + shown + b"\0",
                                        p.P_NR_HDR, timeout, macros=False)
                    if answer is not None or m.message_done:
                        return answer
            if not m.steps & p.P_NOEOH:
                answer = self._send(m, p.STAGE_EOH, p.C_EOH, b"", p.P_NR_EOH, timeout)
                if answer is not None or m.message_done:
                    return answer
            if not m.steps & p.P_NOBODY:
                for chunk in crlf_chunks(message.body_pieces()):
                    m.conn.send(p.C_BODY, chunk)
                    if m.steps & p.P_NR_BODY:
                        continue
                    code, data = m.conn.reply(timeout)
                    if code == p.R_SKIP and m.steps & p.P_SKIP:
                        break
                    answer = self._verdict(m, code, data)
                    if answer is not None or m.message_done:
                        return answer
            self._send_macros(m, p.STAGE_EOM, p.C_BODYEOB)
            m.conn.send(p.C_BODYEOB)
            m.in_message = False
            while True:
                code, data = m.conn.reply(timeout)
                if not self._edit(m, code, data, edits, leadspc):
                    break
            if code == p.R_ACCEPT:
                return None
            return self._verdict(m, code, data)
        except p.MilterError as e:
            return self._fail(m, e)

    def _send(self, m, stage, command, data, no_reply, timeout, macros=True):
        if macros:
            self._send_macros(m, stage, command)
        m.conn.send(command, data)
        if m.steps & no_reply:
            return None
        return self._verdict(m, *m.conn.reply(timeout))

    def _edit(self, m, code, data, edits, leadspc):
        """Apply one modification reply; False when code is none (a verdict)."""
        action = _EDITS.get(code)
        if action is None:
            if code == p.R_QUARANTINE:
                self.log(b"milter: %s asks to quarantine message %s: %s"
                         % (m.spec.name.encode(), self.msg_id, data.rstrip(b"\0")[:200]))
                edits.quarantine = True
                return True
            return False
        flag, method, header = action
        if not m.actions & flag:
            raise p.MilterError("%s: reply %r it did not negotiate" % (m.spec.name, code))
        if header:
            getattr(edits, method)(data, leadspc)
        else:
            getattr(edits, method)(data)
        return True


_EDITS = {
    p.R_ADDHEADER: (p.F_ADDHDRS, "add_header", True),
    p.R_INSHEADER: (p.F_ADDHDRS, "insert_header", True),
    p.R_CHGHEADER: (p.F_CHGHDRS, "change_header", True),
    p.R_ADDRCPT: (p.F_ADDRCPT, "add_recipient", False),
    p.R_ADDRCPT_PAR: (p.F_ADDRCPT_PAR, "add_recipient", False),
    p.R_DELRCPT: (p.F_DELRCPT, "delete_recipient", False),
    p.R_CHGFROM: (p.F_CHGFROM, "change_sender", False),
    p.R_REPLBODY: (p.F_CHGBODY, "replace_body", False),
}

# The macros Postfix sends by default at each stage (its milter_*_macros), and the client's.
_STAGE_MACROS = {
    p.STAGE_CONNECT: {b"j", b"{daemon_name}", b"{daemon_addr}", b"{daemon_port}", b"v", b"_",
                      b"{client_addr}", b"{client_name}", b"{client_port}", b"{client_ptr}"},
    p.STAGE_HELO: {b"{tls_version}", b"{cipher}"},
    p.STAGE_MAIL: {b"i", b"{auth_authen}", b"{mail_addr}", b"{mail_host}", b"{mail_mailer}"},
    p.STAGE_RCPT: {b"{rcpt_addr}", b"{rcpt_host}", b"{rcpt_mailer}"},
    p.STAGE_DATA: {b"i"},
    p.STAGE_EOH: set(),
    p.STAGE_EOM: {b"i"},
}
