"""qmail-send: schedule and hand out deliveries (docs/qmail-send.md "qmail-send"). Started by qmail-start."""
import sys


def _drop_root(home):
    """Started as root (qmail-start does that): run as qmails from here on, in every
    uid slot; bounces go to qmail-qmqpd, which records "for bounce" for qmails."""
    import os
    if os.geteuid() != 0:
        return
    from qmailpy import privs
    from qmailpy.send.loop import StartError
    try:
        privs.become(home, "qmails")
    except privs.PrivError as e:
        raise StartError("unable to switch to qmails: %s" % e) from e


def main(argv=None):
    from qmailpy import logline
    from qmailpy.home import qmail_home
    from qmailpy.send.loop import QmailSend, StartError
    home = qmail_home()
    send = QmailSend(home)
    try:
        _drop_root(home)
        send.start()
    except StartError as e:
        send.log(logline.alert("cannot start: %s" % e))
        return 111
    try:
        return send.run()
    except Exception as e:          # a bug: its traceback in the log, where the administrator looks
        from qmailpy import internalerror
        send.log(logline.alert(internalerror.summary("qmail-send", e) + b"; exiting"))
        internalerror.write(send.log_fd, internalerror.trace("qmail-send", e))
        return 111


if __name__ == "__main__":
    sys.exit(main())
