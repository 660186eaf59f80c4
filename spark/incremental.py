"""Incremental audits (issue 26 point 4): a run given the OUT of an earlier run reads only
what is new since then, and its summaries, findings and report describe everything
audited so far, as one run over all the inputs would.

What OUT holds besides the report (docs/architecture.md "Incremental runs"):

  state.json      the committed state, replaced by one atomic rename at the end of a run:
                  the runs whose tables count, what was read of every input file (a hash
                  of its first bytes, the bytes and lines consumed, its rank), the line
                  counts, log spans, restarts and snapshot times so far, the delivery
                  starts still unanswered, and the size of every Parquet file it names
  runs/NNNNNN/    one run's tables: final/ holds the rows of messages that ended (they
                  accumulate: every committed run's count), open/ the rows of messages still
                  open and of the log-backend segments (only the last run's count: they are
                  recomputed), carried.parquet the items (log events, paired deliveries,
                  snapshot observations) of the open messages, fed again before the new
                  lines next run

A log file is known by the hash of its first bytes (HEAD_BYTES, fewer while it is
shorter), so `current` renamed to @TAI64N.s by multilog, or qmail-send.log to
qmail-send.log.1 (or .2.gz) by logrotate, is read on from where it was left. Only whole
lines are read; a partial last line waits for the next run. A snapshot file is read once.

A run writes its directory and commits by replacing state.json; a run killed before that
leaves a directory state.json does not name, which the next run removes, reading again
what the killed run had read. Every file and directory of the run is fsynced before the
rename and OUT after it, so a power cut never leaves a state naming what the disk lost.
A state whose files are missing or not the size recorded is StateError (bad input: the
administrator starts over with --full). One run at a time holds OUT/lock (lock()).
"""
import fcntl
import hashlib
import json
import os
import shutil

STATE = "state.json"
RUNS = "runs"
HEAD_BYTES = 512            # bytes hashed to know a file again (decompressed for gzip)
TABLES = {"occ": "messages", "tr": "transitions", "m": "qmailanalog_m", "d": "deliveries",
          "f": "findings"}
EXAMPLES_KEPT = 20          # bad-input examples per kind carried from run to run
LOCK = "lock"               # flocked by the run in OUT; holds its pid
FORMAT = 1


class StateError(Exception):
    """The state in OUT cannot be used: nothing is read, nothing is counted."""


class Busy(Exception):
    """Another run holds OUT's lock."""


def lock(out_dir):
    """The descriptor of OUT/lock, flocked for this process's run (released when it is
    closed or the process ends, killed or not), or Busy naming the pid holding it."""
    os.makedirs(out_dir, exist_ok=True)
    fd = os.open(os.path.join(out_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise Busy("%s is in use by another run%s" % (
            out_dir, " (pid %s)" % holder if holder.isdigit() else ""))
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    return fd


def _sync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(top):
    """fsync every file and directory at or below top (a directory's entries with it)."""
    for root, _dirs, names in os.walk(top):
        for name in names:
            _sync(os.path.join(root, name))
        _sync(root)


def _empty():
    return {"format": FORMAT, "runs": [], "open": None, "carried": None, "files": [],
            "ranks": {}, "counts": {}, "spans": {}, "restarts": {}, "last_start": {},
            "pending_starts": [], "snapshots": {}, "latest_snapshot": {},
            "snapshot_heads": [], "bad": [], "sizes": {}}


def load(out_dir, full=False):
    """The committed state of OUT (empty with full, or when there is none), checked."""
    path = os.path.join(out_dir, STATE)
    if full or not os.path.exists(path):
        return _empty()
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise StateError("%s is unreadable (%s)" % (path, e))
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise StateError("%s is not a qmail-audit state of format %d" % (path, FORMAT))
    for rel, size in sorted(state["sizes"].items()):
        name = os.path.join(out_dir, rel)
        try:
            found = os.path.getsize(name)
        except OSError:
            raise StateError("%s is missing: the state names it" % name)
        if found != size:
            raise StateError("%s is %d bytes, committed with %d: it was damaged or written "
                             "by a run that did not finish" % (name, found, size))
    return state


def _file_sizes(out_dir, run):
    sizes = {}
    top = os.path.join(out_dir, RUNS, run)
    for root, _dirs, names in os.walk(top):
        for name in names:
            if name.startswith(".") and name.endswith(".crc"):
                continue
            full = os.path.join(root, name)
            sizes[os.path.relpath(full, out_dir)] = os.path.getsize(full)
    return sizes


def _hash(data):
    return hashlib.sha256(data).hexdigest()


def _fs(sc, path):
    jvm = sc._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(sc._jsc.hadoopConfiguration()), hpath


def _head(sc, f):
    """(first bytes, size in bytes) of an input file; decompressed bytes for gzip."""
    from qmailpy_audit import inputs
    fs, hpath = _fs(sc, f.path)
    size = fs.getFileStatus(hpath).getLen()
    stream = fs.open(hpath)
    try:
        head = bytes(stream.readNBytes(HEAD_BYTES if not f.gzip else inputs.GZIP_HEAD_BYTES))
    finally:
        stream.close()
    if f.gzip:
        head = inputs.gunzip_head(head)
    return head[:HEAD_BYTES], size


def _whole_lines_end(sc, path, size, start):
    """The offset just past the last newline of the file (start if none after start)."""
    fs, hpath = _fs(sc, path)
    stream = fs.open(hpath)
    try:
        end = size
        while end > start:
            begin = max(start, end - 65536)
            stream.seek(begin)
            chunk = bytes(stream.readNBytes(end - begin))
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                return begin + cut + 1
            end = begin
        return start
    finally:
        stream.close()


class Run:
    """One incremental run: the state it starts from and the one it commits."""

    def __init__(self, out_dir, full=False):
        self.out_dir = out_dir
        self.base = load(out_dir, full)
        self.state = json.loads(json.dumps(self.base))      # the copy this run changes
        self._remove_runs(self.base["runs"] if not full else _committed_runs(out_dir))
        top = os.path.join(out_dir, RUNS)
        here = [r for r in os.listdir(top) if r.isdigit()] if os.path.isdir(top) else []
        self.name = "%06d" % (max([int(r) for r in here + self.base["runs"]] + [0]) + 1)
        self.dir = os.path.join(top, self.name)
        self.paths = {}             # (host, rank) -> path, for bad-line examples
        self.lines_read = 0
        self.pieces = []

    def _remove_runs(self, keep):
        """Remove the run directories that no committed state names (a killed run's)."""
        top = os.path.join(self.out_dir, RUNS)
        if not os.path.isdir(top):
            return
        for name in os.listdir(top):
            if name not in keep:
                shutil.rmtree(os.path.join(top, name), ignore_errors=True)

    # --- inputs ----------------------------------------------------------------------

    def _match(self, f, head, claimed):
        """The file record this input continues, or None: of the records this run has not
        given to another file, the one whose first bytes match most of head (a record of an
        empty file, which would match any file, never does), on a tie the one of this path."""
        best = None
        for rec in self.state["files"]:
            if id(rec) in claimed or rec["host"] != f.host or rec["kind"] != f.kind \
                    or not 0 < rec["head_len"] <= len(head):
                continue
            if _hash(head[:rec["head_len"]]) != rec["hash"]:
                continue
            if best is None or (rec["head_len"], rec["path"] == f.path) > \
                    (best["head_len"], best["path"] == f.path):
                best = rec
        return best

    def new_snapshot(self, sc, f):
        """True once for each snapshot file (known by its first bytes)."""
        head, _size = _head(sc, f)
        key = "%s %s" % (f.host, _hash(head))
        if key in self.state["snapshot_heads"]:
            return False
        self.state["snapshot_heads"].append(key)
        return True

    def note_snapshot(self, host, taken, f):
        times = self.state["snapshots"].setdefault(host, [])
        if taken not in times:
            times.append(taken)
            times.sort()
        latest = self.state["latest_snapshot"].get(host)
        if latest is None or taken >= latest[0]:
            self.state["latest_snapshot"][host] = [taken, f.path, f.kind, f.gzip]

    def older_latest_snapshots(self, read_hosts):
        """[(host, taken, path, kind, gzip)] of the newest snapshot of each host not read
        this run: the fleet queue shows it."""
        return [(h, v[0], v[1], v[2], v[3])
                for h, v in sorted(self.state["latest_snapshot"].items())
                if h not in read_hosts]

    def log_rows(self, sc, log_files):
        """(host, rank, index, line) of the whole lines not read before, or None.

        index is the line's number in its file, rank the file's among its host's files
        (kept from run to run), so seq orders one host's lines across runs."""
        from qmailpy_audit import inputs
        rdds = []
        claimed = set()             # records given to a file this run: one file each
        for f in log_files:
            head, size = _head(sc, f)
            if not head:
                continue            # nothing written yet: known by its first bytes once it has some
            rec = self._match(f, head, claimed)
            if rec is not None and rec["offset"] is None and not f.gzip:
                claimed.add(id(rec))
                continue            # a plain copy of a compressed file read whole: its lines were read
            if rec is not None and not f.gzip and size < rec["offset"]:
                rec = None          # shorter than what was read: a new file of the same start
            if rec is None:
                ranks = self.state["ranks"]
                rec = {"host": f.host, "kind": f.kind, "path": f.path, "rank": ranks.get(f.host, 0),
                       "offset": 0, "lines": 0, "head_len": len(head), "hash": _hash(head),
                       "gzip": f.gzip}
                ranks[f.host] = rec["rank"] + 1
                self.state["files"].append(rec)
            elif len(head) > rec["head_len"]:
                rec["head_len"], rec["hash"] = len(head), _hash(head)
            claimed.add(id(rec))
            rec["path"], rec["gzip"] = f.path, f.gzip
            self.paths[(f.host, rec["rank"])] = f.path
            host, rank, first = f.host, rec["rank"], rec["lines"]
            if f.gzip:
                text = sc.binaryFiles(f.path).flatMap(lambda pd: inputs.gzip_lines(pd[1])) \
                    .filter(lambda il, s=first: il[0] >= s)
                rdds.append(text.map(lambda il, h=host, r=rank: (h, r, il[0], il[1])))
                self.pieces.append((rec, None))
                continue
            end = _whole_lines_end(sc, f.path, size, rec["offset"])
            if end <= rec["offset"]:
                continue
            start = rec["offset"]
            text = sc.hadoopFile(f.path, "org.apache.hadoop.mapred.TextInputFormat",
                                 "org.apache.hadoop.io.LongWritable", "org.apache.hadoop.io.Text") \
                .filter(lambda ol, s=start, e=end: s <= ol[0] < e).map(lambda ol: ol[1]) \
                .zipWithIndex()
            rdds.append(text.map(lambda li, h=host, r=rank, s=first: (h, r, s + li[1], li[0])))
            self.pieces.append((rec, end))
        if not rdds:
            return None
        return sc.union(rdds)

    def count_lines(self, rows):
        """Move each file record past the lines of this run (rows persisted by the caller)."""
        last = dict(rows.map(lambda r: ((r[0], r[1]), r[2])).reduceByKey(max).collect()) \
            if rows is not None else {}
        for rec, end in self.pieces:
            top = last.get((rec["host"], rec["rank"]))
            if top is not None:
                self.lines_read += top + 1 - rec["lines"]
                rec["lines"] = top + 1
            if end is not None:
                rec["offset"] = end
            else:
                rec["offset"] = None          # gzip: read whole

    def path_of(self, host, rank):
        return self.paths.get((host, rank))

    # --- sums and spans ----------------------------------------------------------------

    def merge_counts(self, line_counts, spans):
        """(line counts, host spans) of everything audited so far."""
        counts = self.state["counts"]
        for k, v in line_counts.items():
            counts[k] = counts.get(k, 0) + v
        old = self.state["spans"]
        for host, span in spans.items():
            before = old.get(host)
            if before is None:
                old[host] = list(span)
                continue
            before[0] = min(before[0], span[0])
            if span[1] > before[1]:
                before[1:] = list(span[1:])
        return dict(counts), {h: list(s) for h, s in old.items()}

    def keep_bad(self, bad):
        """Bad-input entries of this run's new content, kept for the runs after it; returns
        those of the earlier runs (collapsed to EXAMPLES_KEPT per kind and a count)."""
        earlier = [(b["kind"], b["path"], b["detail"]) for b in self.state["bad"]]
        kept, more = [], {}
        for kind, path, detail in earlier + [(b.kind, b.path, b.detail) for b in bad]:
            if path is None and detail.endswith("more"):
                more[kind] = more.get(kind, 0) + int(detail.split()[0])
            elif sum(1 for k in kept if k[0] == kind) < EXAMPLES_KEPT:
                kept.append((kind, path, detail))
            else:
                more[kind] = more.get(kind, 0) + 1
        self.state["bad"] = [{"kind": k, "path": p, "detail": d} for k, p, d in kept] + \
            [{"kind": k, "path": None, "detail": "%d more" % c} for k, c in sorted(more.items())]
        return earlier

    def restarts(self, found_now, firsts, lasts):
        """{host: restart seqs so far}: this run's (found_now), a first `starting delivery`
        of this run whose id is not above the last of the runs before (firsts, lasts:
        {host: (seq, id)} of this run's first and last start)."""
        found = self.state["restarts"]
        last = self.state["last_start"]
        for host, seqs in found_now.items():
            found.setdefault(host, []).extend(seqs)
        for host, (seq, d) in firsts.items():
            before = last.get(host)
            if before is not None and d <= before[1]:
                found.setdefault(host, []).append(seq)
            last[host] = list(lasts[host])
        return {h: sorted(s) for h, s in found.items()}

    def pairs(self, sc, starts_results, parts):
        """(paired deliveries as process_group takes them, this run's unanswered last
        starts): results matched with their starts, those of the runs before included."""
        keyed = starts_results.union(sc.parallelize(
            [tuple(e) for e in self.base["pending_starts"]], 1)) \
            .map(lambda e: ((e[0], e[5]), e)).groupByKey(parts).map(pair_with_pending)
        return keyed.flatMap(lambda pp: pp[0]), keyed.map(lambda pp: pp[1]) \
            .filter(lambda e: e is not None)

    def previous(self):
        """The summary of the last committed run (a run with nothing new changes nothing)."""
        if not self.base["runs"]:
            return None
        try:
            with open(os.path.join(self.out_dir, "summaries.json"), encoding="utf-8") as f:
                summary = json.load(f)
        except (OSError, ValueError):
            return None
        # A run killed after its commit, before its report, left the report of the run before
        if (summary.get("incremental") or {}).get("run") != int(self.base["runs"][-1]):
            return None
        return summary

    def snapshot_times(self):
        return {h: list(t) for h, t in self.state["snapshots"].items()}

    # --- messages ----------------------------------------------------------------------

    def carried_items(self, spark):
        """((host, n), item) of the messages open at the end of the last run, or None."""
        name = self.base["carried"]
        if name is None or not self.base["runs"]:
            return None
        path = os.path.join(self.out_dir, RUNS, name, "carried.parquet")
        return spark.read.parquet(_uri(path)).rdd.map(
            lambda r: ((r[0], r[1]), _item(json.loads(r[2]))))

    def write_run(self, spark, final_frames, open_frames, carried, pending, schemas):
        """Write this run's tables, then commit it."""
        for part, frames in (("final", final_frames), ("open", open_frames)):
            for tag, name in TABLES.items():
                frames[tag].write.mode("overwrite").parquet(
                    _uri(os.path.join(self.dir, part, name + ".parquet")))
        carried_df = spark.createDataFrame(
            carried.map(lambda kv: (kv[0][0], kv[0][1], json.dumps(kv[1]))),
            "host string, n long, item string")
        carried_df.write.mode("overwrite").parquet(_uri(os.path.join(self.dir,
                                                                     "carried.parquet")))
        self.commit(pending)

    def commit(self, pending):
        """Replace state.json by this run's state, naming the files in runs/NAME: they and
        their directories reach the disk before the rename, the rename right after it.
        A crash at any point leaves the state before or this one, whole."""
        os.makedirs(self.out_dir, exist_ok=True)
        state = self.state
        state["pending_starts"] = [list(e) for e in pending]
        state["runs"] = self.base["runs"] + [self.name]
        state["open"] = state["carried"] = self.name
        sizes = {rel: size for rel, size in self.base["sizes"].items()
                 if (os.sep + "final" + os.sep) in rel}     # the open ones are replaced
        sizes.update(_file_sizes(self.out_dir, self.name))
        state["sizes"] = sizes
        _sync_tree(self.dir)
        _sync(os.path.dirname(self.dir))        # runs/: this run's entry
        _sync(self.out_dir)                     # OUT: runs/ itself, on the first run
        tmp = os.path.join(self.out_dir, STATE + ".new")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.out_dir, STATE))
        _sync(self.out_dir)                     # the rename: the commit itself
        self._drop_old_open()
        self._remove_runs(state["runs"])       # after --full: the runs it replaced

    def _drop_old_open(self):
        """The open tables and carried items of the run before are no longer counted."""
        old = self.base["open"]
        if old is None or old == self.name:
            return
        for name in ("open", "carried.parquet"):
            shutil.rmtree(os.path.join(self.out_dir, RUNS, old, name), ignore_errors=True)

    def view(self, spark, schemas):
        """{tag: DataFrame} of everything audited so far: every committed run's final rows
        and the last run's open ones."""
        frames = {}
        for tag, name in TABLES.items():
            paths = [_uri(os.path.join(self.out_dir, RUNS, r, "final", name + ".parquet"))
                     for r in self.state["runs"]]
            paths.append(_uri(os.path.join(self.out_dir, RUNS, self.state["open"], "open",
                                           name + ".parquet")))
            frames[tag] = spark.read.schema(schemas[tag]).parquet(*paths)
        return frames

    def summary(self):
        return {"run": int(self.name), "runs": len(self.state["runs"]),
                "lines_read": self.lines_read}


def _committed_runs(out_dir):
    try:
        with open(os.path.join(out_dir, STATE), encoding="utf-8") as f:
            return list(json.load(f)["runs"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _item(raw):
    """A carried item back as process_group takes it (JSON made its tuples lists)."""
    tag = raw[0]
    body = tuple(raw[1]) if isinstance(raw[1], list) else raw[1]
    return (tag, body) + tuple(raw[2:])


def group_rows(kv, ctx, process_group):
    """(open, rows, items) of one (host, n): open while its last occurrence has not ended,
    or while it is only snapshot observations the log has not reached yet."""
    (host, n), items = kv
    items = list(items)
    rows = process_group(host, n, items, ctx)
    occs = [r[1] for r in rows if r[0] == "occ"]
    if occs:
        still_open = not occs[-1][9]
    else:
        still_open = any(i[0] == "snap" and (ctx.log_end is None or i[2] >= ctx.log_end)
                         for i in items)
    return still_open, rows, [((host, n), i) for i in items] if still_open else []


def pair_with_pending(kv):
    """messages.pair_deliveries of one (host, id), and its last start if unanswered."""
    from qmailpy_audit import messages
    events = sorted(kv[1], key=lambda e: e[1])
    paired, _unmatched = messages.pair_deliveries(events)
    pending = None
    for ev in events:
        pending = ev if ev[3] == "start" else None
    return paired, pending


def _uri(path):
    return path if "://" in path else "file://" + os.path.abspath(path)
