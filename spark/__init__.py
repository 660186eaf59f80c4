"""qmail-audit: the PySpark audit of qmail queues and logs (DESIGN.md §7).

spark.job.audit() is the job; qmailpy/cli/qmail_audit.py its command line;
spark/submit.py the same command for spark-submit.
"""
