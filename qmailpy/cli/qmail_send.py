"""qmail-send: schedule and hand out deliveries (docs/qmail-send.md "qmail-send"). Started by qmail-start."""
import sys


def main(argv=None):
    from qmailpy import logline
    from qmailpy.home import qmail_home
    from qmailpy.send.loop import QmailSend, StartError
    from qmailpy.send.privileges import drop_root
    home = qmail_home()
    send = QmailSend(home)
    try:
        drop_root(home)
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
