"""POP3 as qmail serves it: qmail-popup reads the name and password and runs
checkpassword, which runs qmail-pop3d in the user's home (qmail-popup(8), qmail-pop3d(8))."""
