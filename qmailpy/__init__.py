"""qmailpy: a qmail-compatible mail transfer agent."""
