"""Power cuts at every point of a protocol: the crash-state explorer (tests/crashstates.py).

Each test records a protocol's file-system calls with strace against a real home (its
queue/, control/ and the users' homes with their Maildirs), builds every disk state a
power cut may leave (every prefix of the calls; unsynced operations lost, one or all,
pairs with QMAILPY_TEST_CRASHSTATES_FULL=1; the last unsynced write torn at each sector boundary,
earlier ones at their half with QMAILPY_TEST_CRASHSTATES_FULL=1; a lost directory's contents gone;
mtimes kept; a new message on an ended message's number, synthesised by cs.renumber),
and for each one runs the real recovery and checks what
a user sees: every message acknowledged before the crash (its qmail-queue exited 0, or
it was queued before the recording) reached every recipient's Maildir at least once (a
bounce counts for a recipient that does not exist), every delivered message is whole,
and the queue drains: qmail-send ends every message and leaves no envelope behind.

Recovery is what a boot does: a new qmail-queue arrives first (nothing orders cron or
an SMTP socket unit after qmail-send), with the log's commit word from a previous boot;
after a cut-off `qmailctl convert` the administrator runs it again; then qmail-send.

Protocols: qmail-queue (both backends; on the log backend group commit and rotation),
qmail-qmqpd's queueing path (acknowledged where its client read K), qmail-send's whole
run (preprocessing, local deliveries with their marks, a bounce, qmail-clean's removals;
on the log backend recovery, checkpoints and the deletion of a garbage segment, and
checkpoints across a segment holding an in-flight message's FINISH: issue 29),
qmail-remote's deliveries to a remote host recorded with it (tests/maildir_peer.py:
the host keeps what it stored durably before its 250; its copy without qmail-send's
record of it is "Possible duplicate!"'s window) and `qmailctl convert` both ways. Long
protocols are checked on an even spread of CAP of their distinct states unless
QMAILPY_TEST_CRASHSTATES_FULL=1; each test prints how many states it explored of how many distinct
ones. A new dimension of the model comes with a known-bad variant of the code
(tests/crash_variants.py) that it must catch and that no other dimension catches: the
tests at the end of this module (docs/testing.md "The crash-state explorer").
"""
from crash_explorer import *  # noqa: F401,F403  (the explorer, its fixture and marks)


def test_a_child_seen_before_its_parents_clone_returns_keeps_its_files(tmp_path):
    """strace may print a new thread's calls before its parent's clone returns (seen in
    the peer of test_remote_deliveries: its store's directory sync was dropped, so a
    message the host had acknowledged looked lost). The parser keeps that thread's fds."""
    root = tmp_path / "queue"
    root.mkdir()
    (tmp_path / "pre" / "queue").mkdir(parents=True)

    def hx(text):
        return "".join("\\x%02x" % b for b in text.encode())
    f = "%s/x" % root
    trace = tmp_path / "trace"
    trace.write_text("\n".join([
        '100 clone3({flags=0x3d0f00, child_tid=0x1}, 88 <unfinished ...>',
        '101 openat(-100<%s>, "%s", 0x41, 0600) = 5<%s>' % (hx("/"), hx(f), hx(f)),
        '100 <... clone3 resumed>) = 101',
        '101 write(5<%s>, "%s", 2) = 2' % (hx(f), hx("ab")),
        '101 fsync(5<%s>) = 0' % hx(f),
        '101 +++ exited with 0 +++', '']))
    rec = cs.parse(str(trace), {"queue": str(root)}, str(tmp_path / "pre"), {})
    assert [op.kind for op in rec.ops] == ["create", "write", "fsync"]
    assert cs.not_durable(rec.ops, 3) == [0]          # the name needs its directory's sync


def test_a_state_materialised_over_another_is_the_same_disk(explorer_base):
    """Explorer.check writes each state over the one before, as its recovery left it,
    keeping the directories (cs.materialise keep_dirs). For every 6th state of a
    qmail-queue run that makes queue/log (states with and without the directory), after a recovery's
    kind of changes (files added, rewritten, linked, chmod'ed; a directory added; a kept
    directory's mode changed), the disk is the one a materialisation from nothing makes
    (disk_image: every entry's type, mode, owner, contents, hard links, modelled times)."""
    ex = Explorer(explorer_base, "log")
    shutil.rmtree(os.path.join(ex.home.queue, "log"))
    rec = ex.record_queue_runs([[("m1", RCPTS)]])
    found = cs.states(rec, single_keeps=True)[::6]     # each costs a fresh materialisation
    assert any("queue/log" not in tree.dirs for _, tree in found) and any("queue/log" in tree.dirs for _, tree in found)
    for n, (state, tree) in enumerate(found):
        cs.materialise(tree, ex.roots, ex.owner_of)
        fresh = disk_image(ex.roots, tree)
        cs.materialise(found[n - 1][1], ex.roots, ex.owner_of, keep_dirs=True)
        # what a recovery may do to the state before
        queue = ex.home.queue
        with open(os.path.join(queue, "todo", "999"), "wb") as f:
            f.write(b"left by a recovery")
        os.makedirs(os.path.join(queue, "made", "deeper"))
        os.chmod(os.path.join(queue, "todo"), 0o777)
        for path in [os.path.join(d, f) for d, _, fs in os.walk(queue) for f in fs if "lock" not in d][:3]:
            os.chmod(path, 0o604)
            os.link(path, path + ".also")
            with open(path, "ab") as f:
                f.write(b"appended")
        cs.materialise(tree, ex.roots, ex.owner_of, keep_dirs=True)
        assert disk_image(ex.roots, tree) == fresh, state.describe(rec)
    print("states materialised over another: %d, each the same disk" % len(found))


def test_log_checkpoint_across_a_finish(explorer_base):
    """A checkpoint lists message M in flight; M finishes in the next segment, which a
    later checkpoint deletes with M's body (tests/checkpoint_scenario.py). Every crash
    right after a segment's unlink is explored (every state with QMAILPY_TEST_CRASHSTATES_FULL=1):
    with the old checkpoint still on disk, M came back without its body (issue 29)."""
    ex = Explorer(explorer_base, "log")
    rec = ex.record_checkpoint_scenario()
    if FULL:
        explored, distinct, failures = ex.explore(rec, None)
    else:
        explored, distinct, failures = ex.explore(rec, None, only=kept_or_all_lost,
                                                  prefixes=after_segment_unlinks(rec))
    report("log checkpoints across a segment with an in-flight message's FINISH", explored, distinct, failures)


def test_log_checkpoint_unlinking_first_is_caught(explorer_base):
    """The same run with issue 29's order (crash_variants.unlink_before_checkpoint): the
    explorer must find the state that revives M."""
    ex = Explorer(explorer_base, "log")
    rec = ex.record_checkpoint_scenario("unlink_before_checkpoint")
    explored, distinct, failures = ex.explore(rec, None, only=kept_or_all_lost,
                                              prefixes=after_segment_unlinks(rec))
    print("crash states explored: pre-fix checkpoint order: %d, failing: %d" % (explored, len(failures)))
    assert any("ended: " in f or "unable to open" in f for f in failures), failures[:3]


def test_a_lost_log_directory_loses_its_segments(explorer_base):
    """A directory whose mkdir a power cut lost takes what was made in it along
    (crashstates.Tree.prune). qmail-queue's first run makes queue/log: unless that mkdir
    is durable in queue/ before the ENVELOPE's fsync, the acknowledged message is lost
    (crash_variants.log_dir_unsynced, caught here); qmailpy syncs queue/ (log/commit.py)."""
    results = {}
    for variant in (None, "log_dir_unsynced"):
        base = os.path.join(explorer_base, variant or "fixed")
        os.mkdir(base)
        ex = Explorer(base, "log")
        shutil.rmtree(os.path.join(ex.home.queue, "log"))   # as before a queue's first message
        if variant:
            crash_variants.install(ex.home, "qmail-queue", variant)
        rec = ex.record_queue_runs([[("m1", RCPTS)]])
        results[variant] = ex.explore(rec, None, only=lost_mkdir("queue/log"))
    print("crash states explored: lost queue/log: %d (fixed), %d (variant, failing %d)"
          % (results[None][0], results["log_dir_unsynced"][0], len(results["log_dir_unsynced"][2])))
    assert results["log_dir_unsynced"][2], "the explorer missed a lost queue/log"
    report("log qmail-queue x1, queue/log's mkdir lost", *results[None])


@pytest.mark.parametrize("variant", [None, "not_before_after_fsync"])
def test_not_before_holds_survive(explorer_base, variant):
    """A not-before time ($QMAILNOTBEFORE) is the mess file's mtime (utimensat, traced):
    every state after qmail-queue's exit 0 holds it, so a power cut never delivers a
    held message early. Setting it after the fsync (crash_variants.not_before_after_fsync)
    is caught."""
    ex = Explorer(explorer_base, "dir")
    if variant:
        crash_variants.install(ex.home, "qmail-queue", variant)
    rec = ex.record_queue_runs([[("m1", RCPTS), ("m2", RCPTS)]], env={"QMAILNOTBEFORE": str(NOT_BEFORE)})
    assert any(op.kind == "utime" for op in rec.ops), "no utimensat recorded"
    found = cs.states(rec)
    failures = ["%s\n    %s" % (state.describe(rec), problem) for state, tree in found
                for problem in not_before_lost(rec, tree, state)]
    if variant:
        print("crash states explored: not-before variant: %d, failing %d" % (len(found), len(failures)))
        assert failures, "the explorer missed a not-before time set after the fsync"
    else:
        report("dir qmail-queue x2 with a not-before time", len(found), len(found), failures)


def test_no_untraced_calls_unknown():
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    used = set()
    for dirpath, _, names in os.walk(os.path.join(top, "qmailpy")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    code = f.read()
                for call in cs.UNTRACED_CALLS:
                    if re.search(r"(?<![\w.])%s\b" % re.escape(call), code):
                        used.add((os.path.relpath(path, top), call))
    unknown = sorted(used - set(UNTRACED_KNOWN))
    assert not unknown, "untraced by the crash-state explorer (crashstates.UNTRACED_CALLS): %s" % [
        "%s: %s (%s)" % (path, call, cs.UNTRACED_CALLS[call]) for path, call in unknown]


def test_a_tear_at_a_sector_boundary_is_caught(explorer_base):
    """The last unsynced write torn at each sector boundary (not only at its half): an
    ENVELOPE appended HEADER_GAP bytes before a boundary, cut there, leaves less than a
    record header, which the log's readers must take for the end of the log.
    crash_variants.short_header_read, which unpacks the header regardless, is caught by
    those states only: the cut at half leaves a whole header."""
    def record(ex):
        ex.pad_head(HEADER_GAP)
        return ex.record_queue_runs([[("m1", RCPTS)]])
    results = compare("short_header_read", variant_homes(explorer_base, "log", ("qmail-queue", "qmail-send")),
                      record, only=of_kind("last unsynced write torn"))
    failing = results["short_header_read"][2]
    assert failing, "the explorer missed a record header read past the data"
    assert all("torn after %d bytes" % HEADER_GAP in f for f in failing), failing[:3]
    report("log qmail-queue x1, the append torn at a sector boundary", *results[None])


def test_an_earlier_torn_write_is_caught(explorer_base):
    """Earlier unsynced writes torn (at half) while later ones are kept: qmail-send's
    records of one message's deliveries, appended one after another and synced
    together, the first torn and the next ones whole: a bad record with good ones after
    it. crash_variants.corrupt_read_as_torn_end (recovery cutting the log at the first
    bad record) loses the message queued after the crash; only these states show it (a
    torn last write is a torn end, and an append is lost only with the ones after it)."""
    def record(ex):
        ex.queue("m1", RCPTS)
        from_previous_boot(ex.home.queue)
        return ex.record_send_run()
    results = compare("corrupt_read_as_torn_end", variant_homes(explorer_base, "log", ("qmail-send",)),
                      record, cap=10, only=appended_behind, earlier_tears=True)
    assert results["corrupt_read_as_torn_end"][2], "the explorer missed a corrupt stretch read as the end"
    report("log qmail-send run (1 message, 2 deliveries), an earlier append torn", *results[None])


def test_a_torn_snapshot_under_the_starts_that_name_it(explorer_base):
    """Found by the full run (2 of 982 states of test_remote_deliveries): m1's
    PREPROCESSED torn, its START records (local, remote) and the REPLACEMENT that ends
    local kept, and the DELIVERY of remote after it. Recovery ignored the STARTs (they
    name a lost snapshot) and kept the checkpoint's m1 ENVELOPE as not yet preprocessed:
    qmail-send preprocessed m1 again beside its live REPLACEMENT, the runner offered that
    one too, remote was delivered twice at once and qmail-send stopped on
    `internal error in qmail-send: KeyError: 'remote'`. Recovery now takes the ENVELOPE
    as superseded (the REPLACEMENT's prev is later) and the REPLACEMENT as in flight from
    the STARTs, with the deltas after it (log/recovery.py)."""
    ex = Explorer(explorer_base, "log")
    ex.add_peer()
    ex.queue("m1", [RCPTS[0], REMOTE])
    ex.queue("m2", [REMOTE])
    rec = ex.record_send_run()
    report("log qmail-send run, 2 remote deliveries, a snapshot torn under its REPLACEMENT",
           *ex.explore(rec, None, only=a_snapshot_torn_under_its_replacement, earlier_tears=True))


def test_a_pair_of_lost_operations_is_caught(explorer_base):
    """Pairs of unsynced operations lost together. After qmail-queue's exit 0 its pid/
    name's unlink and intd/n's creation are never durable (todo/n and mess/S/n are).
    crash_variants.pid_name_means_unfinished leaves a message alone when both are
    lost, and only then: every state with one of them lost, or all unsynced lost
    (the pid/ name's creation with them), passes."""
    results = compare("pid_name_means_unfinished", variant_homes(explorer_base, "dir", ("qmail-send",)),
                      lambda ex: ex.record_queue_runs([[("m1", RCPTS)]]), pair_drops=None,
                      only=lambda rec, state: state.prefix == len(rec.ops) and state.how != "prefix")
    failing = results["pid_name_means_unfinished"][2]
    assert failing, "the explorer missed two lost names misread together"
    assert all("(two unsynced lost)" in f for f in failing), failing[:3]
    report("dir qmail-queue x1, after its exit: one, two or all unsynced lost", *results[None])


def test_one_kept_operation_is_caught(explorer_base):
    """All unsynced operations lost but one name operation: qmail-clean's removal of an
    ended message's body kept (another message's fsync of mess/S/ made it durable) while
    the earlier removals of its todo/, info/ and channel files are lost.
    crash_variants.bodiless_todo_kept_while_info_is_there (todo/n without a body removed
    only when info/ is gone) is caught; one of those removals lost alone, or all, leaves
    no todo/n with info/ and no body."""
    def record(ex):
        ex.queue("m1", [RCPTS[0]])
        return ex.record_send_run()
    results = compare("bodiless_todo_kept_while_info_is_there", variant_homes(explorer_base, "dir", ("qmail-send",)),
                      record, single_keeps=True, only=the_body_removal_kept)
    assert results["bodiless_todo_kept_while_info_is_there"][2], "the explorer missed a body removal kept alone"
    report("dir qmail-send run (1 message), only the body's removal kept", *results[None])


def test_a_new_message_on_an_ended_messages_number(explorer_base):
    """Inode reuse (tests/reuse_scenario.py, renumbered by cs.renumber): message a ends,
    qmail-clean unlinks its body, and a new message b is given a's number while a's
    removals of its intd/ and channel files may still be unsynced. Every state that lost
    one of those removals, kept those of info/a and todo/a (lost: the next test) and kept
    b is explored (the one-unsynced-kept ones too with QMAILPY_TEST_CRASHSTATES_FULL=1): b
    reaches b@, and no one gets a message not sent to them. crash_variants.leftovers_inherited (preprocessing that
    removes an earlier life's channel files only when its info/ is there, as qmail) is
    caught."""
    results = {}
    make = variant_homes(explorer_base, "dir", ("qmail-send",))
    for variant in (None, "leftovers_inherited"):
        ex = make(variant)
        rec, a = ex.record_reuse_scenario()
        results[variant] = ex.explore(rec, None, single_keeps=FULL, first_failure=variant is not None,
                                      only=a_removal_lost_under_a_new_message(a, LEFTOVERS, ENDED))
    print("crash states explored: a number reused: real code %d (failing %d), variant %d (failing %d)"
          % (results[None][0], len(results[None][2]), results["leftovers_inherited"][0],
             len(results["leftovers_inherited"][2])))
    assert results["leftovers_inherited"][2], "the explorer missed a channel file inherited by a new message"
    report("dir qmail-send run, a new message on an ended message's number", *results[None])


def test_a_lost_info_or_todo_removal_under_a_new_message(explorer_base):
    """The states of the test above that lost a's todo/ or info/ removal: todo/a (a's
    envelope), or info/a with a's channel file and its recipient's done mark lost, is
    back while mess/S/a is b's body. Found by this explorer (14 of 56 states: a@ gets
    b, or b's empty body before it was written). POSIX allows it (those unlinks and the
    body's are in different directories and only mess/S/ was synced); ext4's journal,
    which commits name operations in order, does not."""
    ex = Explorer(explorer_base, "dir")
    rec, a = ex.record_reuse_scenario()
    report("dir qmail-send run, a new message on an ended message's number, a's todo/ or info/ removal lost",
           *ex.explore(rec, None, single_keeps=True, only=a_removal_lost_under_a_new_message(a, ENDED, ()),
                       first_failure=True))
