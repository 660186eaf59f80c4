"""The log-structured backend: queue.py's LogQueue and its parts (docs/log-queue.md)."""
