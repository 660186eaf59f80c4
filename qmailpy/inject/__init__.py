"""qmail-inject (docs/submission.md "qmail-inject") and the sendmail wrapper's option handling (docs/submission.md "sendmail")."""
