"""Where `qmailctl start`'s daemons log: HOME/log/NAME.log, rotated to NAME.@STAMP.log
(qmailpy.ctl.logwriter writes them; qmailctl and qmail-audit read qmail-send's).

STAMP is the UTC time of the rotation (YYYYMMDDTHHMMSS.ffffffZ), so the rotated
files sort oldest first and before the current NAME.log.
"""
import calendar
import os
import time

LOG_DIR = "log"                 # under the home
SEND_LOG = "qmail-send.log"
SMTPD_LOG = "qmail-smtpd.log"
QMQPD_LOG = "qmail-qmqpd.log"
SUBMISSION_LOG = "qmail-submission.log"


def rotated_name(name, t):
    """NAME.log rotated at time t: NAME.@YYYYMMDDTHHMMSS.ffffffZ.log."""
    stem = name[:-len(".log")] if name.endswith(".log") else name
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)
    return "%s.@%s.log" % (stem, stamp)


def stamp_time(rotated):
    """The time a rotated name carries, one microsecond on (0 when unreadable)."""
    try:
        stamp = rotated.rsplit(".@", 1)[1][:-len("Z.log")]
        whole, micro = stamp.split(".")
        return calendar.timegm(time.strptime(whole, "%Y%m%dT%H%M%S")) + (int(micro) + 1) / 1e6
    except (IndexError, ValueError):
        return 0


def log_set(logdir, name):
    """Paths of NAME.log's rotated files, oldest first, then NAME.log itself if present."""
    try:
        return [os.path.join(logdir, n) for n in log_names(os.listdir(logdir), name)]
    except FileNotFoundError:
        return []


def log_names(names, name):
    """log_set's names, from the directory's names."""
    stem = name[:-len(".log")] if name.endswith(".log") else name
    prefix = stem + ".@"
    found = sorted(n for n in names if n.startswith(prefix) and n.endswith(".log"))
    if name in names:
        found.append(name)
    return found
