"""Which room may import which (docs/architecture.md "Rooms and what they may import").

Every import statement of every module, at the top or inside a function, parsed with ast:
generic tools (qmailpy/util/) import no qmailpy code; the core (qmailpy/*.py) imports only the
core and util/; the backends import no program's room; the audit (spark/, installed as
qmailpy_audit) imports the core, util/ and the backends' readers, never a program's room.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "qmailpy")
# each program family's folder: its own code, which only it and cli/ should need
PROGRAM_ROOMS = ("send", "ctl", "smtpd", "remote", "local", "inject", "pop3", "cli", "milter",
                 "queue", "helpers")
SHARED = ("util", "backends")


def imports(path):
    """(line, module) for each module an ast of the file imports (from X import Y: X and X.Y)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, "%s.%s" % (node.module, alias.name)


def modules(folder, recursive=True):
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(top, name)
        if not recursive:
            return


def room_of(module):
    """The room a qmailpy module name belongs to: 'core', 'util', 'backends', a program's
    folder, or None for a name outside qmailpy."""
    parts = module.split(".")
    if parts[0] != "qmailpy":
        return None
    if len(parts) == 1 or not os.path.isdir(os.path.join(PACKAGE, parts[1])):
        return "core"
    return parts[1]


def crossings(paths, allowed):
    """'path:line imports module' for every qmailpy import whose room is not allowed."""
    found = []
    for path in paths:
        for line, module in imports(path):
            room = room_of(module)
            if room is not None and room not in allowed:
                found.append("%s:%d imports %s" % (os.path.relpath(path, ROOT), line, module))
    return found


def test_every_program_room_is_a_folder():
    for room in PROGRAM_ROOMS + SHARED:
        assert os.path.isfile(os.path.join(PACKAGE, room, "__init__.py")), room


def test_util_imports_no_qmailpy_code_but_util():
    assert crossings(modules(os.path.join(PACKAGE, "util")), {"util"}) == []


def test_the_core_imports_only_the_core_and_util():
    core = list(modules(PACKAGE, recursive=False))
    assert os.path.join(PACKAGE, "layout.py") in core
    assert crossings(core, {"core", "util"}) == []


@pytest.mark.parametrize("name", ["layout.py", "snapshot_format.py"])
def test_layout_and_snapshot_format_do_not_import_the_backends(name):
    path = os.path.join(PACKAGE, name)
    assert [m for _, m in imports(path) if m.startswith("qmailpy.backends")] == []


def test_the_backends_import_no_program_room():
    assert crossings(modules(os.path.join(PACKAGE, "backends")), {"core", "util", "backends"}) == []


def test_the_audit_imports_no_program_room():
    audit = list(modules(os.path.join(ROOT, "spark")))
    assert audit
    assert crossings(audit, {"core", "util", "backends"}) == []


def test_a_crossing_is_seen(tmp_path):
    """The check itself: an import of a program room inside a function is found."""
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from qmailpy.send.loop import QmailSend\n"
                    "import qmailpy.ctl.daemons\n")
    assert sorted(crossings([str(path)], {"core", "util"})) == [
        "%s:2 imports qmailpy.send.loop" % os.path.relpath(path, ROOT),
        "%s:2 imports qmailpy.send.loop.QmailSend" % os.path.relpath(path, ROOT),
        "%s:3 imports qmailpy.ctl.daemons" % os.path.relpath(path, ROOT)]
