"""qmail-queue, the queue server and the client that reaches either."""
