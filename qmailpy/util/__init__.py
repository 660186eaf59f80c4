"""Generic tools, as Postfix's util/: nothing here knows qmail's files, accounts or programs.

Each module imports only the standard library and other util modules
(tests/test_import_rooms.py checks it), so any room may use them.
"""
