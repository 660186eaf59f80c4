"""qmail-inject (spec §11.1) and the sendmail wrapper's option handling (§11.2)."""
