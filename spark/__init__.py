"""qmail-audit: the PySpark audit of qmail queues and logs (docs/architecture.md "The audit").

qmailpy_audit.job.audit() is the job (installed as qmailpy_audit, from this folder); qmailpy/cli/qmail_audit.py is its command line, and
spark-submit runs that same file (`spark-submit $(python -c 'import qmailpy.cli.qmail_audit
as m; print(m.__file__)') [options] INPUT...`), which then uses the master it was given.
"""
