"""The repository explains itself: every `docs/FILE.md "Heading"` reference in a
tracked text file names a document in docs/ and a heading in it, references
between the documents resolve the same way, and nothing refers to a document
outside the repository."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
THIS = os.path.relpath(os.path.abspath(__file__), ROOT)

TEXT_SUFFIXES = (".py", ".md", ".1", ".5", ".8", ".conf", ".cfg", ".toml",
                 ".service", ".socket", ".timer")
TEXT_NAMES = ("bin/demo", "bin/setup", "bin/test", ".ci/run")

# A reference may be wrapped over lines of a comment or docstring: a line end,
# the next line's indentation and comment marker count as one space.
LINE_BREAK = re.compile(r"\n[ \t]*(?:#+[ \t]*|\.\\\"[ \t]*)?")
REFERENCE = re.compile(r'docs/([A-Za-z0-9_.-]+\.md)\s+"([^"\n]+)"')
# Inside docs/, the documents cite each other as `FILE.md` "Heading".
SIBLING_REFERENCE = re.compile(r'`([A-Za-z0-9_.-]+\.md)`\s+"([^"\n]+)"')
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)

# Documents that live outside the repository, and the way code used to cite them.
OUTSIDE = [re.compile(p) for p in (r"QMAIL-BEHAVIOUR", r"DESIGN\.md", r"\bspec\s*§",
                                   r"\bspec\s+Appendix")]


def text_files():
    """Tracked files (and new ones not ignored) that hold text we write."""
    try:
        out = subprocess.run(["git", "-c", "safe.directory=" + ROOT, "ls-files", "-z",
                              "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names
            if (n.endswith(TEXT_SUFFIXES) or n in TEXT_NAMES) and os.path.isfile(os.path.join(ROOT, n))]


def read(relpath):
    with open(os.path.join(ROOT, relpath), encoding="utf-8", errors="replace") as f:
        return f.read()


def headings(path):
    """The heading texts of a Markdown file, outside fenced code blocks."""
    text, inside = [], False
    for line in read(path).splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            text.append(line)
    return {m.group(1) for m in HEADING.finditer("\n".join(text))}


def references(text, pattern=REFERENCE):
    return [(m.group(1), m.group(2)) for m in pattern.finditer(LINE_BREAK.sub(" ", text))]


def broken(refs, where):
    """Every (document, heading) of refs that does not resolve, described."""
    bad = []
    for doc, heading in refs:
        path = os.path.join("docs", doc)
        if not os.path.isfile(os.path.join(ROOT, path)):
            bad.append('%s: docs/%s does not exist (for "%s")' % (where, doc, heading))
        elif heading not in headings(path):
            bad.append('%s: docs/%s has no heading "%s"' % (where, doc, heading))
    return bad


def test_the_documents_exist():
    for name in ("README.md", "architecture.md", "queue-format.md", "log-queue.md", "protocols.md",
                 "qmail-send.md", "delivery.md", "submission.md", "control-files.md"):
        assert os.path.isfile(os.path.join(DOCS, name)), name


def test_every_docs_reference_names_an_existing_heading():
    files = text_files()
    bad, seen = [], 0
    for name in files:
        if name == THIS:
            continue          # its examples of broken references are deliberate
        text = read(name)
        refs = references(text)
        if name.startswith("docs/"):
            refs += references(text, SIBLING_REFERENCE)
        seen += len(refs)
        bad += broken(refs, name)
    assert seen > 0, "no docs/ reference found: the scan itself is broken"
    assert not bad, "\n".join(bad)


def test_nothing_refers_to_a_document_outside_the_repository():
    bad = []
    for name in text_files():
        if name == THIS:
            continue
        for number, line in enumerate(read(name).splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                bad.append("%s:%d: %s" % (name, number, line.strip()))
    assert not bad, "\n".join(bad)


def test_a_wrong_heading_is_reported(tmp_path):
    """The checker itself: a made-up heading and a made-up document are caught,
    also when the reference is wrapped over two comment lines."""
    text = ('# see docs/queue-format.md "State machine" and docs/qmail-send.md "Scheduling and\n'
            '# retries" but docs/queue-format.md "No such heading" and docs/nowhere.md "X"\n')
    refs = references(text)
    assert refs == [("queue-format.md", "State machine"), ("qmail-send.md", "Scheduling and retries"),
                    ("queue-format.md", "No such heading"), ("nowhere.md", "X")]
    assert broken(refs, "t") == ['t: docs/queue-format.md has no heading "No such heading"',
                                 't: docs/nowhere.md does not exist (for "X")']
