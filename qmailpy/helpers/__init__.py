"""qmail's delivery helpers for .qmail program lines: preline, condredirect, bouncesaying,
except, maildirmake, forward (docs/delivery.md "Delivery helpers"). The programs are
qmailpy.cli.<name>; this package holds what they share."""
