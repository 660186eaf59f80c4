"""qmail-smtpd: SMTP reception (docs/submission.md "qmail-smtpd"), run per connection on a pair of fds.

session.py holds the dialogue; data.py the DATA state machine; address.py the
MAIL/RCPT argument parsing and the rcpthosts/badmailfrom/localiphost checks;
config.py the control files and environment; received.py the Received line.
"""
