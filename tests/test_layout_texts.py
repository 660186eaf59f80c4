"""queue-layout/*.conf, the texts, against the code's own definitions and a real home.

layout.conf is data qmailpy.hierarchy reads; its header and the log backend's account of
queue/log in log-records.conf are prose that nothing reads, so they are checked here:
field counts, owners, groups, modes and names against the modules that define them,
and the files a real log queue holds against what log-records.conf lists.
(tests/test_logqueue_layout.py checks log-records.conf's record, header and frame rows.)
"""
import os
import re
import stat

import pytest

from qmailpy import hierarchy, layout, privs
from qmailpy.backends.log import (commit as logcommit, counts as logcounts,
                                  recovery as logrecovery, segments as logsegments)

LAYOUT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "queue-layout")


def _text(name):
    with open(os.path.join(LAYOUT_DIR, name)) as f:
        return f.read()


def _log_rows():
    """log-records.conf's `file` and `dir` rows: {name: (kind, description)}."""
    rows = {}
    for line in _text("log-records.conf").splitlines():
        words = line.split(None, 2)
        if words[:1] in (["file"], ["dir"]):
            rows[words[1]] = (words[0], words[2])
    return rows


def _log_modes():
    """log-records.conf's account of queue/log's owner, group and modes."""
    m = re.search(r"Files in queue/log/ \(directory: owner (\w+), group (\w+), mode (\d+),[^;]*;\s*"
                  r"#\s*files (\d+), .*? except (\w+) and (\w+), .*?: (\d+),", _text("log-records.conf"), re.S)
    assert m, "log-records.conf no longer describes queue/log's owner, group and modes"
    return m


def _log_entry():
    (entry,) = [e for e in hierarchy.load_layout() if e.path == "queue/log"]
    return entry


def test_the_commit_word_has_the_fields_the_code_writes():
    kind, text = _log_rows()["commit"]
    m = re.fullmatch(r"(\d+) x u64: (.*)", text)
    assert kind == "file" and m, text
    fields = [f.strip() for f in m.group(2).split(",")]
    assert int(m.group(1)) == len(fields) == logcommit.COMMIT_SIZE // 8
    # the same fields, in order, as logcommit's own account of the word
    doc = re.findall(r"\[(\d+)\]\s+(\w+)", logcommit.__doc__)
    assert [int(offset) for offset, _ in doc] == list(range(0, logcommit.COMMIT_SIZE, 8))
    assert [f.split()[-1] for f in fields] == [
        {"synced_seg": "segment", "synced_end": "end"}.get(name, name) for _, name in doc]


def test_the_log_directory_is_described_as_layout_conf_makes_it():
    m = _log_modes()
    entry = _log_entry()
    assert (m.group(1), m.group(2), int(m.group(3), 8)) == (entry.owner, entry.group, entry.mode)
    assert int(m.group(4), 8) == logcommit.FILE_MODE
    assert (m.group(5), m.group(6)) == (logrecovery.CHECKPOINT, logcounts.COUNTS)


def test_the_log_files_listed_are_the_codes_names():
    rows = _log_rows()
    assert rows.pop("NNNNNNNNNN.seg")[0] == "file" and logcommit.segment_name(7) == "0000000007.seg"
    code = {"lock": "file", "sync": "file", "commit": "file", logrecovery.CHECKPOINT: "file",
            logcounts.COUNTS: "file", logsegments.QUARANTINE: "dir"}
    assert {name: kind for name, (kind, _) in rows.items()} == code


@pytest.mark.parametrize("queue_backend", ["log"], indirect=True)
def test_a_real_log_queue_holds_only_what_log_records_conf_lists(qmail_home, daemons):
    """qmail-queue and qmail-send write the log; each name in queue/log/ is a listed one."""
    done = qmail_home.queue_message(b"Subject: x\n\nbody\n", b"a@test.example", [b"nobody@test.example"])
    assert done.returncode == 0, done.stderr
    daemons.start()
    daemons.wait_line(r"^end msg ")
    daemons.stop()
    rows = _log_rows()
    logdir = os.path.join(qmail_home.queue, "log")
    names = sorted(os.listdir(logdir))
    assert {"commit", "checkpoint", "0000000001.seg"} <= set(names)
    modes = _log_modes()
    own = {modes.group(5): int(modes.group(7), 8), modes.group(6): int(modes.group(7), 8)}
    for name in names:
        st = os.lstat(os.path.join(logdir, name))
        listed = "NNNNNNNNNN.seg" if re.fullmatch(r"\d{10}\.seg", name) else name
        assert listed in rows, "queue/log/%s is not in log-records.conf" % name
        assert rows[listed][0] == ("dir" if stat.S_ISDIR(st.st_mode) else "file")
        if stat.S_ISREG(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == own.get(name, logcommit.FILE_MODE), name
    entry = _log_entry()
    st = os.stat(logdir)
    assert stat.S_IMODE(st.st_mode) == entry.mode
    owners = hierarchy.Owners(qmail_home.path)
    assert (st.st_uid, st.st_gid) == (owners.uid(entry.owner), owners.gid(entry.group))


def test_layout_conf_header_names_the_codes_types_roles_and_split():
    text = _text("layout.conf")
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    types = re.findall(r"^#\s+(?:TYPE\s+)?(dir|split|file|fifo)\s{2,}", header, re.M)
    assert tuple(types) == hierarchy.ENTRY_TYPES
    assert "subdirectories 0..%d" % (layout.SPLIT - 1) in header
    groups = re.search(r"GROUP\s+a group role: (.*)", header).group(1)
    assert re.findall(r"`(\w+)`", groups) == list(privs.GROUP_ROLES)
    entries = hierarchy.load_layout()
    assert {e.group for e in entries} <= set(privs.GROUP_ROLES)
    assert {e.owner for e in entries} <= set(privs.USER_ROLES) | {"root"}


def test_layout_conf_sizes_are_the_codes():
    from qmailpy.remote import tcpto
    sizes = {e.path: e.size for e in hierarchy.load_layout() if e.size is not None}
    assert sizes["queue/lock/tcpto"] == tcpto.SIZE
    assert set(sizes) == {"queue/lock/tcpto", "queue/lock/tcpto6"}
