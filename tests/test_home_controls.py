"""Reading control files (qmailpy.home): contents, defaults, and what cannot be read."""
import os

import pytest

from qmailpy.home import ControlError, control_int, control_list, control_value


def test_values_lists_and_defaults(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "me").write_bytes(b"mx.example \t\r\nsecond line\n")
    (tmp_path / "control" / "rcpthosts").write_bytes(b"# comment\n\na.example  \nb.example\n")
    (tmp_path / "control" / "databytes").write_bytes(b"  -12abc\n")
    (tmp_path / "control" / "big").write_bytes(b"x" * 200000 + b"\n")
    home = str(tmp_path)
    assert control_value(home, "me") == b"mx.example"
    assert control_list(home, "rcpthosts") == [b"a.example", b"b.example"]
    assert control_int(home, "databytes", 7) == 7          # no leading digit: qmail's default
    assert control_value(home, "big") == b"x" * 200000          # longer than one read
    assert control_value(home, "absent", b"dflt") == b"dflt"
    assert control_list(home, "absent") is None


def test_a_directory_or_an_unreadable_file_is_an_error_not_a_default(tmp_path):
    (tmp_path / "control" / "me").mkdir(parents=True)
    with pytest.raises(ControlError, match="unable to read control/me: Is a directory"):
        control_value(str(tmp_path), "me")
    (tmp_path / "control" / "locals").write_bytes(b"a\n")
    os.chmod(tmp_path / "control" / "locals", 0)
    if os.geteuid() != 0:          # root reads it anyway
        with pytest.raises(ControlError, match="unable to read control/locals: Permission denied"):
            control_list(str(tmp_path), "locals")


def test_roles_are_read_again_when_the_file_changes(tmp_path):
    # A queueing worker keeps what it read of control/roles; a change must reach it,
    # also one that keeps the file's size (written by qmailctl, or by an editor in place).
    from qmailpy import privs
    (tmp_path / "control").mkdir()
    roles = tmp_path / "control" / "roles"
    roles.write_text("qmaild:aaaa\n")
    assert privs.load_roles(str(tmp_path))["qmaild"] == "aaaa"
    privs.write_roles(str(tmp_path), dict(privs.load_roles(str(tmp_path)), qmaild="bbbb"))
    assert privs.load_roles(str(tmp_path))["qmaild"] == "bbbb"
    with open(roles, "r+") as f:             # in place, same size
        text = f.read()
        f.seek(0)
        f.write(text.replace("qmaild:bbbb", "qmaild:cccc"))
    os.utime(roles, ns=(1, 1))                # even with the old times put back: ctime moves
    assert privs.load_roles(str(tmp_path))["qmaild"] == "cccc"
    changed = privs.load_roles(str(tmp_path))
    changed["qmaild"] = "mutated"             # a caller's copy, not the kept one
    assert privs.load_roles(str(tmp_path))["qmaild"] == "cccc"
