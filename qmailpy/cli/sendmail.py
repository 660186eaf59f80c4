"""sendmail (and mailq): qmail's sendmail wrapper, run in-process (docs/submission.md "sendmail").

Exit statuses are sendmail's sysexits; see qmailpy.inject.sendmail.
"""
import os
import sys


def _fatal(message, code):
    sys.stderr.write("sendmail: fatal: %s\n" % message)
    return code


def _queue_listing(prog):
    import importlib
    try:
        qread = importlib.import_module("qmailpy.cli.qmail_qread")
    except ImportError:
        return _fatal("unable to run qmail-qread", 75)
    return qread.main([])


def main(argv=None):
    from qmailpy.fileio import open_std_fds
    stdin_closed = 0 in open_std_fds()
    argv = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "sendmail"
    if prog == "mailq":
        return mailq(argv)
    from qmailpy.inject import sendmail as wrapper
    if prog == "newaliases":
        return _fatal("please use fastforward or edit ~alias/.qmail-* instead of newaliases",
                      wrapper.EX_UNAVAILABLE)
    try:
        req = wrapper.parse(argv)
    except wrapper.UsageError as e:
        sys.stderr.write("sendmail: %s\n%s" % (e, wrapper.USAGE))
        return wrapper.EX_USAGE
    from qmailpy.home import qmail_home
    home = qmail_home()
    try:
        os.chdir(home)
    except OSError:
        return _fatal("unable to switch to qmail home directory", wrapper.EX_TEMPFAIL)
    if req.mode == "queue":
        return _queue_listing(prog)
    if req.mode == "smtp":
        from qmailpy.smtpd.session import serve
        return serve(home, wrapper.smtp_environment(os.environ))
    if req.not_before is not None:      # read by qmail-queue (docs/queue-format.md "Not-before time")
        from qmailpy.mess import NOT_BEFORE
        os.environ[NOT_BEFORE] = "%d" % req.not_before
    from qmailpy.inject.run import ClosedInput, Options, inject
    options = Options(strategy=req.strategy, args=req.recipients, sender=req.sender)
    code = inject(home, options, wrapper.inject_environment(os.environ, req),
                  ClosedInput() if stdin_closed else sys.stdin.buffer, sys.stdout.buffer, sys.stderr.buffer, prog="sendmail")
    return wrapper.exit_status(code)


def mailq(argv=None):
    """mailq: the queue listing, as sendmail -bp."""
    from qmailpy.home import qmail_home
    try:
        os.chdir(qmail_home())
    except OSError:
        return _fatal("unable to switch to qmail home directory", 75)
    return _queue_listing("mailq")


if __name__ == "__main__":
    sys.exit(main())
