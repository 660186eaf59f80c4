"""qmail-send log lines parsed in the JVM: Spark SQL columns built from qmailpy.logline.

The same rows as logparse.parse_line, without calling Python for each line:
every regular expression here is made from the one definition of the line
(logline's patterns and prefixes, logparse's known starts and journald markers),
translated mechanically into Java's dialect:

* Python's named groups `(?P<name>...)` become plain groups, read by number
  (Java names may hold no underscore);
* `match` anchors at the start: `^` is prepended; `$` at the end becomes `\\z`
  (Java's `$` would also match before a final U+2028 or CR);
* `(?s)`: the lines hold no newline, so Python's `.` is Java's `.` with DOTALL.

A line's kind is decided by its whole pattern; a field that is one word of the line
(word_fields(), read from the same pattern) is then cut from the line's words instead of
running the pattern again.

lines(df) takes (host, rank, index, line) and returns one row per line with

  lkind   logline's kind ("new msg", ...), "bad:CLASS" or "ignored:journald-marker"
  host    the journald host of the line, else the file's
  seq     logparse.seq_of(rank, index)
  time    as logparse: TAI64N rebuilt from the label's digits, epoch and ISO as logline
  ekind   the event kind of logparse's event tuple (None for status lines and the like)
  n, d, a_long, a_str, b_long, b_str, c   the tuple's fields (a and b hold a number or
          a string by kind: event_tuple() puts them back in logparse's order)
  text    for bad lines: the line's first 300 characters
"""
import re

from pyspark.sql import Window
from pyspark.sql import functions as F

from qmailpy import logline
from qmailpy_audit import logparse

# logparse's event kinds for logline's kinds (None: counted only)
EVENT_KIND = {"new msg": "new", "info msg": "info", "starting delivery": "start",
              "delivery": "result", "report mangled": "result", "bounce msg": "bounce",
              "triple bounce": "triple", "end msg": "end", "bounce now": "bouncenow",
              "set aside": "setaside", "state restored": "restored",
              **logparse.COMMAND_KINDS}
# event kinds whose a (or b) field is a number
A_IS_NUMBER = ("info", "bounce", "restored")
B_IS_NUMBER = ("restored",)
TAI64_OFFSET = 2 ** 62 + 10
_TEXT_LIMIT = 300


def java_regex(pattern, whole=True):
    """(Java source, {group name: number}) of a compiled Python pattern used with match()."""
    src = pattern.pattern
    if "(?P=" in src:
        raise ValueError("back-references by name are not translated: %r" % src)
    java = re.sub(r"\(\?P<\w+>", "(", src)
    if whole and java.endswith("$") and not java.endswith("\\$"):
        java = java[:-1] + r"\z"
    return "(?s)^" + java, dict(pattern.groupindex)


PATTERNS = [(kind,) + java_regex(p) for kind, p in logline._PATTERNS]
_EPOCH, _ = java_regex(logline._EPOCH, whole=False)
_TAI64N, _ = java_regex(logline._TAI64N, whole=False)
_ISO, _ = java_regex(logline._ISO, whole=False)
_TAG, _ = java_regex(logline._JOURNAL_TAG, whole=False)
# journalctl's framing, matched after Python's rstrip(): trailing white space allowed
_MARKER = "(?U)" + java_regex(logparse._JOURNAL_MARKER)[0][:-2] + r"[\s\x1c-\x1f]*\z"
_SPACE = r"[\s\x1c-\x1f]"          # what str.strip() removes: (?U)\s and the separators


def _group(column, regex, name_or_number):
    return F.regexp_extract(column, regex, name_or_number)


def literal_start(regex):
    """The literal characters a Java regex from java_regex() must begin with."""
    body = regex[len("(?s)^"):]
    start = re.match(r"[^\\.^$*+?{}\[\]|()]*", body).group(0)
    if start and body[len(start):len(start) + 1] in ("*", "+", "?", "{"):
        start = start[:-1]              # the quantifier makes its last character optional
    return start


def _kind_of(text):
    """logline's kind of a prefix-free text, or None: the first pattern that matches.

    Each pattern is tried only on texts that begin with its literal start: a string
    comparison, where a regular expression that fails is tried at every position."""
    expr = None
    for kind, regex, _ in PATTERNS:
        cond = text.startswith(literal_start(regex)) & text.rlike(regex)
        expr = F.when(cond, F.lit(kind)) if expr is None else expr.when(cond, F.lit(kind))
    return expr


# group bodies that cannot match a space (a field of one word)
_ONE_WORD = re.compile(r"\\d\+|\\S[*+]|\\w\+|\[\^ \][*+]|\w+(\|\w+)*")
_LITERAL = re.compile(r"[A-Za-z0-9_:/<>,=-]*")


def word_fields(pattern):
    """{group name: (word number, characters before it, characters after it)} of a
    logline pattern whose words are separated by single spaces, each group within one
    word and unable to match a space; None for a pattern of another form.

    A text the pattern matches then holds each field at that place among its words split
    at spaces: the field is cut from its word, where regexp_extract would run the whole
    expression again for each field."""
    src = pattern.pattern
    if src.endswith("$"):
        src = src[:-1]
    words, depth, start, in_class = [], 0, 0, False
    for i, c in enumerate(src):
        if c == "\\" or in_class:
            in_class = in_class and c != "]"
            continue
        if c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == " ":
            if depth:
                return None
            words.append(src[start:i])
            start = i + 1
    words.append(src[start:])
    out = {}
    for number, word in enumerate(words, 1):
        m = re.fullmatch(r"(.*?)\(\?P<(\w+)>(.*)\)(.*)", word)
        if m is None:
            if "(" in word or not _LITERAL.fullmatch(word):
                return None
            continue
        before, name, body, after = m.groups()
        if not (_ONE_WORD.fullmatch(body) and _LITERAL.fullmatch(before)
                and _LITERAL.fullmatch(after)):
            return None
        out[name] = (number, len(before), len(after))
    return out


WORD_FIELDS = {kind: word_fields(p) for kind, p in logline._PATTERNS}


def _field(text, kind, name, cast=None, words=None):
    """Field `name` of the kinds that have it (None for the others); cut from `words`
    (the text split at spaces) for the kinds of word_fields()."""
    expr = None
    for k, regex, groups in PATTERNS:
        if name not in groups:
            continue
        place = WORD_FIELDS[k] and WORD_FIELDS[k].get(name)
        if words is not None and place:
            number, before, after = place
            word = F.try_element_at(words, F.lit(number))
            value = F.substring(word, before + 1, F.length(word) - before - after) \
                if before or after else word
        else:
            value = F.regexp_extract(text, regex, groups[name])
        cond = kind == k
        expr = F.when(cond, value) if expr is None else expr.when(cond, value)
    if cast:
        expr = expr.try_cast(cast)
    return expr


def _hex(digits):
    return F.conv(digits, 16, 10).cast("decimal(21,0)")


def _stamp_style(line):
    """The timestamp prefix's style: epoch, tai64n, iso or None, tried in logline's order."""
    return F.when(line.rlike(_EPOCH), F.lit("epoch")).when(line.rlike(_TAI64N), F.lit("tai64n")) \
        .when(line.rlike(_ISO), F.lit("iso"))


def _stamp_parts(line):
    """Columns of what the prefix of each style is made of, each extracted once (a later
    stage reads them by name: an expression repeated in a projection is generated and
    compiled at each use): _stamp, the prefix's text; _nsec, a TAI64N label's
    nanoseconds in decimal; _g1.._g8, an ISO stamp's groups."""
    style = F.col("_style")
    iso_whole = "(?s)^(" + _ISO[len("(?s)^"):] + ")"
    stamp = F.when(style == "epoch", _group(line, _EPOCH, 1)) \
        .when(style == "tai64n", F.substring(line, 1, 26)) \
        .when(style == "iso", _group(line, iso_whole, 1))
    out = [stamp.alias("_stamp"),
           F.when(style == "tai64n", F.conv(F.substring(line, 18, 8), 16, 10)).alias("_nsec")]
    out += [F.when(style == "iso", _group(line, _ISO, i)).alias("_g%d" % i) for i in range(1, 9)]
    return out


def _timestamp():
    """(seconds as logparse reads them or None, length of the prefix) of _stamp_parts'
    columns."""
    style, stamp, nsec = F.col("_style"), F.col("_stamp"), F.col("_nsec")
    # logparse rebuilds the TAI64N value from its digits, as qmailanalog's matchup prints it
    tai = F.concat((_hex(F.substring(stamp, 2, 16)) - F.lit(TAI64_OFFSET)).cast("string"),
                   F.lit("."),
                   F.when(F.length(nsec) >= 9, nsec).otherwise(F.lpad(nsec, 9, "0"))) \
        .try_cast("double")

    def g(i):
        return F.col("_g%d" % i)
    days = F.datediff(F.make_date(g(1).cast("int"), g(2).cast("int"), F.lit(1)),
                      F.lit("1970-01-01").cast("date")) + g(3).cast("int") - 1
    base = days.cast("long") * 86400 + g(4).cast("long") * 3600 + g(5).cast("long") * 60 \
        + g(6).cast("long")
    frac = F.when(g(7) != "", g(7).try_cast("double")).otherwise(F.lit(0.0))
    zone = g(8)
    digits = F.regexp_replace(F.substring(zone, 2, 10), ":", "")
    offset = F.when((zone == "") | (zone == "Z"), F.lit(0)).otherwise(
        F.when(F.substring(zone, 1, 1) == "+", F.lit(-1)).otherwise(F.lit(1))
        * (F.substring(digits, 1, 2).cast("long") * 3600
           + F.substring(digits, 3, 10).cast("long") * 60))
    iso = base.cast("double") + frac + offset.cast("double")
    when = F.when(style == "epoch", stamp.try_cast("double")) \
        .when(style == "tai64n", tai) \
        .when(style == "iso", iso)
    length = F.when(style == "epoch", F.length(stamp) + 1) \
        .when(style == "tai64n", F.lit(26)) \
        .when(style == "iso", F.length(stamp)) \
        .otherwise(F.lit(0))
    return when, length


def _stripped(text):
    """text as str.strip() leaves it."""
    return F.regexp_replace(text, "(?U)^%s+|%s+$" % (_SPACE, _SPACE), "")


def _bad_class(stripped):
    """logparse.classify_bad, and empty-line, for a text no pattern matched, stripped."""
    truncated = None
    for start in logparse._KNOWN_STARTS:
        cond = F.startswith(stripped, F.lit(start.strip())) | (
            (F.length(stripped) >= 3) & F.startswith(F.lit(start), stripped))
        truncated = cond if truncated is None else truncated | cond
    return F.when(stripped == "", F.lit("empty-line")) \
        .when(truncated, F.lit("truncated-line")).otherwise(F.lit("unknown-line"))


def lines(df):
    """Rows as the module docstring says, for a frame of (host, rank, index, line).

    Built in stages, each a projection of the one before: a value that later
    expressions use more than once is a column of an earlier stage, never an
    expression repeated (docs/architecture.md "Reading log lines: in Python or in the
    JVM")."""
    line = F.col("line")
    df = df.select("host", "rank", "index", "line", _stamp_style(line).alias("_style"))
    df = df.select("*", *_stamp_parts(line))
    when, length = _timestamp()
    df = df.select("host", "rank", "index", "line", "_style", when.alias("_when"),
                   F.substring(line, length + 1, 1 << 30).alias("_rest"))
    rest = F.col("_rest")
    # journalctl -o short-iso: 'HOST IDENT[PID]: ' after the stamp; read first as a tag,
    # then as part of a bare qmail line (logline._prefix_readings)
    tag_whole = "(?s)^(" + _TAG[len("(?s)^"):] + ")"
    df = df.select("*", F.when((F.col("_style") == "iso") & rest.rlike(_TAG),
                               _group(rest, tag_whole, 1)).alias("_tag"))
    tag = F.col("_tag")
    df = df.select("*", F.when(tag.isNotNull(), _group(rest, _TAG, 1)).alias("_tag_host"),
                   F.when(tag.isNotNull(), F.substring(rest, F.length(tag) + 1, 1 << 30))
                   .alias("_after_tag"))
    df = df.select("*", F.when(F.col("_tag_host").isNotNull(), _kind_of(F.col("_after_tag")))
                   .alias("_kind1"), _kind_of(rest).alias("_kind2"))
    tag_reading = F.col("_kind1").isNotNull()
    bare_reading = F.col("_kind2").isNotNull()
    df = df.select(
        "host", "rank", "index", "line", "_when",
        F.when(tag_reading, F.col("_after_tag")).when(bare_reading, rest)
        .when(F.col("_tag_host").isNotNull(), F.col("_after_tag")).otherwise(rest).alias("_text"),
        F.when(tag_reading, F.col("_kind1")).otherwise(F.col("_kind2")).alias("_kind"),
        F.when(tag_reading, F.col("_tag_host")).otherwise(F.col("host")).alias("_host"))
    kind, text = F.col("_kind"), F.col("_text")
    marker = line.startswith("-- ") & line.rlike(_MARKER)
    df = df.select("*", F.when(~marker & kind.isNull(), _stripped(text)).alias("_stripped"))
    lkind = F.when(marker, F.lit("ignored:journald-marker")) \
        .when(kind.isNull(), F.concat(F.lit("bad:"), _bad_class(F.col("_stripped")))) \
        .when(F.col("_when").isNull(), F.lit("bad:no-timestamp")) \
        .otherwise(kind)
    df = df.select("*", lkind.alias("lkind"))
    lkind = F.col("lkind")
    df = df.select("*", (~lkind.startswith("bad:") & ~lkind.startswith("ignored:")).alias("_good"))
    good = F.col("_good")
    split = [k for k, places in WORD_FIELDS.items() if places]
    df = df.select("*", F.when(kind.isin(*split), F.split(text, " ", -1)).alias("_words"))
    words = F.col("_words")

    def field(name, cast=None):
        return _field(text, kind, name, cast, words)
    ekind = F.when(good, _mapped(kind, EVENT_KIND))
    n = field("n", "long")
    d = field("d", "long")
    letter = _mapped(field("result"), logparse.RESULT_LETTER)
    a_long = F.when(kind == "info msg", field("bytes", "long")) \
        .when(kind == "bounce msg", field("qp", "long")) \
        .when(kind == "state restored", field("seg", "long"))
    a_str = F.when(kind == "starting delivery", field("channel")) \
        .when(kind == "delivery", letter) \
        .when(kind == "report mangled", F.lit("z")) \
        .when(kind.isin("bounce now", "set aside"), field("text"))
    b_long = F.when(kind == "state restored", field("off", "long"))
    b_str = F.when(kind == "info msg", field("sender")) \
        .when(kind == "starting delivery", field("recipient")) \
        .when(kind == "delivery", field("text")) \
        .when(kind == "report mangled", F.lit("report_mangled"))
    c = F.when(kind == "info msg", _pair(text, kind, words, "qp", "uid")) \
        .when(kind == "state restored", _pair(text, kind, words, "damage_seg", "damage_off"))
    seq = F.shiftleft(F.col("rank").cast("long"), logparse.SEQ_SHIFT).bitwiseOR(F.col("index"))
    return df.select(
        "lkind",
        F.when(good, F.col("_host")).otherwise(F.col("host")).alias("host"),
        F.col("rank"), F.col("index"), seq.alias("seq"),
        F.when(good, F.col("_when")).alias("time"), ekind.alias("ekind"),
        n.alias("n"),
        d.alias("d"), a_long.alias("a_long"), a_str.alias("a_str"), b_long.alias("b_long"),
        b_str.alias("b_str"), c.alias("c"),
        F.when(lkind.startswith("bad:"), F.substring(line, 1, _TEXT_LIMIT)).alias("text"))


def _pair(text, kind, words, first, second):
    """'%d %d' of two number fields, as logparse writes them."""
    return F.concat_ws(" ", _field(text, kind, first, "long", words).cast("string"),
                       _field(text, kind, second, "long", words).cast("string"))


def _mapped(column, mapping):
    expr = None
    for key, value in mapping.items():
        cond = column == key
        expr = F.when(cond, F.lit(value)) if expr is None else expr.when(cond, F.lit(value))
    return expr


def event_tuple(row):
    """A row of lines() with an ekind as logparse's event tuple."""
    kind = row[6]
    a = row[9] if kind in A_IS_NUMBER else row[10]
    b = row[11] if kind in B_IS_NUMBER else row[12]
    return (row[1], row[4], row[5], kind, row[7], row[8], a, b, row[13])




# --- reading --------------------------------------------------------------

_ROW_BITS = 33             # monotonically_increasing_id: partition << 33 | row in partition
_NO_FEWER = 1 << 30         # coalesce(): at most this many partitions
_TEXT_SCHEMA = "host string, rank int, index long, line string"


def read(spark, files, gzip_text):
    """Parsed lines (lines()) of log files, rank = position in files, persisted.

    A plain file is read by Spark's text source, one frame per file, so a line's
    index is its partition << PART_SHIFT | its row in the partition; the partitions are
    numbered over the union of all the files (a file's splits in order, one after
    another), which line_index() reads back. The index is given after the union: a
    nondeterministic column there keeps Spark from pushing lines()'s projection into
    each file's branch (with 20 hosts' logs, the driver spent minutes generating and
    compiling 20 copies of its code). gzip_text(f) gives (index, line) of a gzip file,
    which is read whole (gzip cannot be split) by Python."""
    frames = []
    for rank, f in enumerate(files):
        if f.gzip:
            frame = spark.createDataFrame(
                gzip_text(f).map(lambda il, h=f.host, r=rank: (h, r, il[0], il[1])),
                _TEXT_SCHEMA)
        else:
            frame = spark.read.text(f.path).select(
                F.lit(f.host).alias("host"), F.lit(rank).alias("rank"),
                F.lit(None).cast("long").alias("index"), F.col("value").alias("line"))
        frames.append(frame)
    if not frames:
        return None
    whole = frames[0]
    for frame in frames[1:]:
        whole = whole.unionAll(frame)
    mono = F.monotonically_increasing_id()
    index = F.shiftleft(F.shiftright(mono, _ROW_BITS), logparse.PART_SHIFT) \
        .bitwiseOR(mono.bitwiseAND((1 << _ROW_BITS) - 1))
    whole = whole.select("host", "rank", F.coalesce("index", index).alias("index"), "line")
    # A boundary of whole-stage code generation: without it, lines()'s code is generated
    # into each member of the union, once per file (20 hosts: megabytes of Java source,
    # half a minute compiling it). Coalescing to more partitions than there are is no
    # shuffle: partitions may come in another order, never merged, and each line's index
    # was given below, from its partition in the union.
    return lines(whole.coalesce(_NO_FEWER))


def tallies(parsed):
    """(line counts by kind as logparse counts them, {host: [first time, last seq,
    its time, its kind]}, {(rank, partition): lines}) in one pass."""
    good = ~F.col("lkind").startswith("bad:") & ~F.col("lkind").startswith("ignored:")
    rows = parsed.groupBy("lkind", "host", "rank", F.shiftright("index", logparse.PART_SHIFT)
                          .alias("part")) \
        .agg(F.count(F.lit(1)).alias("lines"),
             F.min(F.when(good, F.col("time"))).alias("first"),
             F.max(F.when(good, F.struct("seq", "time", "lkind"))).alias("last")).collect()
    counts, spans, parts = {}, {}, {}
    for r in rows:
        counts[r.lkind] = counts.get(r.lkind, 0) + r.lines
        parts[(r.rank, r.part)] = parts.get((r.rank, r.part), 0) + r.lines
        if r.last is None:
            continue
        span = spans.setdefault(r.host, [r.first, r.last[0], r.last[1], r.last[2]])
        span[0] = min(span[0], r.first)
        if r.last[0] > span[1]:
            span[1:] = list(r.last)
    return counts, spans, parts


def line_index(rank, index, parts):
    """The index of a line in its whole file, from its partition's and the line counts."""
    part = index >> logparse.PART_SHIFT
    before = sum(v for (r, p), v in parts.items() if r == rank and p < part)
    return before + (index & ((1 << logparse.PART_SHIFT) - 1))


def bad_lines(parsed, limit):
    """The first `limit` bad lines, in file and line order, as logparse's bad tuples
    (class, host, rank, index, text)."""
    rows = parsed.filter(F.col("lkind").startswith("bad:")).orderBy("seq") \
        .select("lkind", "host", "rank", "index", "text").limit(limit).collect()
    return [(r["lkind"][4:], r["host"], r["rank"], r["index"], r["text"]) for r in rows]


def events(parsed, kinds=None):
    """logparse's event tuples (an RDD) of the lines that are events, but delivery results
    (paired_deliveries() matches those with their starts in the JVM); only those of
    `kinds` when given."""
    chosen = F.col("ekind").isNotNull() & (F.col("ekind") != "result")
    if kinds is not None:
        chosen = F.col("ekind").isin(*kinds)
    return parsed.filter(chosen).rdd.map(event_tuple)


def paired_deliveries(parsed):
    """messages.pair_deliveries as a window, in the JVM: a result belongs to the line just
    before it among its (host, delivery id)'s starts and results when that line is a start
    (matchup(1): a later start overwrites a pending one; a result answers it once).
    An RDD of ((host, n), ("del", delivery, seq, time)) as process_group takes them."""
    return paired_frame(parsed).rdd.map(_paired_item)


def paired_frame(parsed):
    """paired_deliveries' results as a frame: the result's host, d, seq, time, ekind,
    a_str (letter), b_str (reason), and its start's as p_ekind, p_n, p_time, p_a_str
    (channel), p_b_str (recipient), p_seq."""
    w = Window.partitionBy("host", "d").orderBy("seq")
    before = [F.lag(c).over(w).alias("p_" + c) for c in ("ekind", "n", "time", "a_str", "b_str",
                                                          "seq")]
    return parsed.filter(F.col("ekind").isin("start", "result")) \
        .select("host", "d", "seq", "time", "ekind", "a_str", "b_str", *before) \
        .filter((F.col("ekind") == "result") & (F.col("p_ekind") == "start"))


def _paired_item(r):
    host, d, seq, when, _, letter, reason, _, n, dstart, channel, recipient, start_seq = r
    return ((host, n), ("del", (dstart, d, channel, recipient, letter, reason, start_seq),
                        seq, when))


def restarts(parsed):
    """{host: seqs where a `starting delivery` id is not above the one before it}: where
    qmail-send began numbering again (job._restarts, in the JVM)."""
    w = Window.partitionBy("host").orderBy("seq")
    rows = parsed.filter(F.col("ekind") == "start") \
        .select("host", "seq", (F.col("d") <= F.lag("d").over(w)).alias("drop")) \
        .filter(F.col("drop")).select("host", "seq").collect()
    found = {}
    for host, seq in rows:
        found.setdefault(host, []).append(seq)
    return {host: sorted(seqs) for host, seqs in found.items()}
