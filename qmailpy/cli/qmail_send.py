"""qmail-send: schedule and hand out deliveries (spec §6). Started by qmail-start."""
import sys


def main(argv=None):
    from qmailpy import logline
    from qmailpy.home import qmail_home
    from qmailpy.send.loop import QmailSend, StartError
    send = QmailSend(qmail_home())
    try:
        send.start()
    except StartError as e:
        send.log(logline.alert("cannot start: %s" % e))
        return 111
    return send.run()


if __name__ == "__main__":
    sys.exit(main())
