"""RFC 822 address lists as qmail-inject reads and rewrites them (docs/submission.md "qmail-inject").

parse() turns a field body into mailboxes and groups; every address can be
rewritten; render() emits the list again with ", " separators, folded as
",\\n " past 80 columns. Words that follow an address without a "." or "@"
between them start a new address ("illegal spaces become commas"), as qmail's
token822 does. ParseError for what cannot be read: unbalanced quotes, comments,
brackets or angle brackets, and misplaced ":" ";" "<" ">".
"""
from qmailpy.envelope import quote2

_SPECIALS = frozenset(b"<>@,;:.")
_SPACE = frozenset(b" \t\r\n")
WIDTH = 80

ATOM, QUOTED, LITERAL, COMMENT, SPECIAL = range(5)


class ParseError(ValueError):
    pass


class Token:
    __slots__ = ("kind", "text", "space")

    def __init__(self, kind, text, space):
        self.kind, self.text, self.space = kind, text, space   # space: whitespace came before

    def value(self):
        """The token's meaning inside an address: quoted strings lose quotes and escapes."""
        if self.kind != QUOTED:
            return self.text
        out = bytearray()
        body = self.text[1:-1]
        i = 0
        while i < len(body):
            if body[i] == 92 and i + 1 < len(body):
                i += 1
            out.append(body[i])
            i += 1
        return bytes(out)


def tokenize(text):
    tokens = []
    i, n = 0, len(text)
    space = False
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            space = True
            i += 1
            continue
        start = i
        if ch == 34 or ch == 91:             # "quoted" or [literal]
            close = 34 if ch == 34 else 93
            i += 1
            while i < n and text[i] != close:
                i += 2 if text[i] == 92 else 1
            if i >= n:
                raise ParseError("unbalanced %s" % ('"' if ch == 34 else "["))
            i += 1
            tokens.append(Token(QUOTED if ch == 34 else LITERAL, text[start:i], space))
        elif ch == 40:                        # (comment), nested
            depth = 0
            while i < n:
                c = text[i]
                if c == 92:
                    i += 2
                    continue
                if c == 40:
                    depth += 1
                elif c == 41:
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            if i >= n:
                raise ParseError("unbalanced (")
            i += 1
            tokens.append(Token(COMMENT, text[start:i], space))
        elif ch == 41 or ch == 93:
            raise ParseError("unbalanced %s" % chr(ch))
        elif ch in _SPECIALS:
            i += 1
            tokens.append(Token(SPECIAL, text[start:i], space))
        else:
            while i < n and text[i] not in _SPACE and text[i] not in _SPECIALS \
                    and text[i] not in (34, 40, 41, 91, 93):
                i += 1
            tokens.append(Token(ATOM, text[start:i], space))
        space = False
    return tokens


class Mailbox:
    """One address: phrase tokens (angle form) or None, the address bytes, trailing comments."""

    def __init__(self, address, phrase=None, comments=()):
        self.address = address
        self.phrase = phrase
        self.comments = list(comments)

    def render(self):
        if self.phrase is not None:
            text = b"<" + quote2(self.address) + b">"
            if self.phrase:
                text = _join(self.phrase) + b" " + text
        else:
            text = quote2(self.address)
        for c in self.comments:
            text += b" " + c.text
        return text


class Group:
    def __init__(self, phrase, members):
        self.phrase = phrase
        self.members = members


def _join(tokens):
    out = bytearray()
    for i, t in enumerate(tokens):
        if i and t.space:
            out += b" "
        out += t.text
    return bytes(out)


def _is_word(t):
    return t.kind in (ATOM, QUOTED)


def _address(tokens):
    """The bytes of an addr-spec from its tokens (no comments)."""
    return b"".join(t.value() for t in tokens)


def _plain_mailboxes(tokens):
    """Split tokens with no angle brackets into addr-specs; comments attach to the one before."""
    boxes = []
    current = []
    comments = []

    def finish():
        if current:
            boxes.append(Mailbox(_address(current), None, comments[:]))
        elif comments and boxes:
            boxes[-1].comments.extend(comments)
        current.clear()
        comments.clear()

    for t in tokens:
        if t.kind == COMMENT:
            comments.append(t)
            continue
        if current and (_is_word(t) or t.kind == LITERAL):
            prev = current[-1]
            if not (prev.kind == SPECIAL and prev.text in (b".", b"@")):
                finish()
        current.append(t)
    finish()
    return boxes


def _angle_address(tokens):
    """Inside <...>: drop a source route (@a,@b:) and comments."""
    words = [t for t in tokens if t.kind != COMMENT]
    if words and words[0].kind == SPECIAL and words[0].text == b"@":
        for i, t in enumerate(words):
            if t.kind == SPECIAL and t.text == b":":
                words = words[i + 1:]
                break
        else:
            raise ParseError("source route without ':'")
    for t in words:
        if t.kind == SPECIAL and t.text in (b"<", b",", b";", b":"):
            raise ParseError("unexpected %r inside <>" % t.text.decode("latin-1"))
    return _address(words)


def parse(text):
    """A list of Mailbox and Group from a field body (bytes)."""
    tokens = tokenize(text)
    items = []
    group = None            # (phrase, members) while inside "phrase: ... ;"
    pending = []
    i = 0

    def target():
        return group[1] if group is not None else items

    def flush_pending():
        target().extend(_plain_mailboxes(pending))
        pending.clear()

    while i < len(tokens):
        t = tokens[i]
        i += 1
        if t.kind != SPECIAL or t.text in (b".", b"@"):
            pending.append(t)
            continue
        s = t.text
        if s == b",":
            flush_pending()
        elif s == b":":
            if group is not None or any(p.kind == SPECIAL for p in pending):
                raise ParseError("unexpected ':'")
            group = ([p for p in pending if p.kind != COMMENT], [])
            pending.clear()
        elif s == b";":
            if group is None:
                raise ParseError("';' outside a group")
            flush_pending()
            items.append(Group(*group))
            group = None
        elif s == b"<":
            phrase = [p for p in pending if p.kind != COMMENT]
            if any(p.kind == SPECIAL and p.text == b"@" for p in phrase):
                # "a@b <c@d>": the words before '<' are an address of their own
                flush_pending()
                phrase = []
            pending.clear()
            inner = []
            while i < len(tokens) and not (tokens[i].kind == SPECIAL and tokens[i].text == b">"):
                inner.append(tokens[i])
                i += 1
            if i >= len(tokens):
                raise ParseError("unbalanced <")
            i += 1
            box = Mailbox(_angle_address(inner), phrase)
            while i < len(tokens) and tokens[i].kind == COMMENT:
                box.comments.append(tokens[i])
                i += 1
            target().append(box)
        else:                                # '>'
            raise ParseError("unbalanced >")
    flush_pending()
    if group is not None:
        raise ParseError("group without ';'")
    return items


def mailboxes(items):
    """Every Mailbox, group members included, in order."""
    for item in items:
        if isinstance(item, Group):
            yield from item.members
        else:
            yield item


def rewrite(items, fn):
    for box in mailboxes(items):
        box.address = fn(box.address)
    return items


def render(items, column):
    """The list as header text starting at `column`; folded past WIDTH columns."""
    units = []
    for item in items:
        if isinstance(item, Group):
            head = _join(item.phrase) + b":"
            if not item.members:
                units.append(head + b";")
                continue
            rendered = [m.render() for m in item.members]
            rendered[0] = head + b" " + rendered[0]
            rendered[-1] += b";"
            units.extend(rendered)
        else:
            units.append(item.render())
    out = bytearray()
    col = column
    for k, unit in enumerate(units):
        if k:
            if col + 2 + len(unit) > WIDTH:
                out += b",\n "
                col = 1
            else:
                out += b", "
                col += 2
        out += unit
        col += len(unit)
    return bytes(out)
