"""The directory backend (qmail's own queue layout): queue.py's DirQueue and its parts."""
