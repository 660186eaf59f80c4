"""The Sendmail/Postfix milter protocol, version 6, as qmail-smtpd's client (docs/milter.md)."""
