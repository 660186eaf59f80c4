"""The S1-S5 table: every legal move made with real files, every other move rejected."""
import itertools
import os

import pytest

from qmailpy import states
from qmailpy.states import HELD, S1, S2, S3, S4, S5

# How each legal move changes the files of one message (docs/queue-format.md "State machine").
MOVES = {
    (S1, S2): lambda f: f | {"mess"},
    (S2, S3): lambda f: f | {"intd"},
    (S3, S4): lambda f: f | {"todo"},
    (S4, S5): lambda f: (f | {"info", "local", "remote"}) - {"todo", "intd"},
    (S4, HELD): lambda f: (f | {"info", "local", "remote", "hold"}) - {"todo", "intd"},
    (S5, S2): lambda f: f - {"info", "local", "remote", "bounce"},
    (S2, S1): lambda f: f - {"mess"},
    (S3, S2): lambda f: f - {"intd"},
    (S5, HELD): lambda f: f | {"hold"},
    (HELD, S5): lambda f: f - {"hold"},
    (S5, S1): lambda f: set(),
    (HELD, S1): lambda f: set(),
    (S4, S1): lambda f: set(),
}
START = {S1: set(), S2: {"mess"}, S3: {"mess", "intd"}, S4: {"mess", "intd", "todo"},
         S5: {"mess", "info", "remote"}, HELD: {"mess", "info", "remote", "hold"}}


def make(queue, present, n=100):
    """Create message n's files of the given kinds under queue; return the kinds found on disk."""
    for kind in present:
        rel = {"intd": "intd/%d", "todo": "todo/%d", "bounce": "bounce/%d", "hold": "hold/%d"}.get(kind, kind + "/%d/%%d" % (n % 23))
        path = os.path.join(queue, rel % n)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
    found = set()
    for kind in states.FILES:
        for root, dirs, files in os.walk(os.path.join(queue, kind)):
            if str(n) in files:
                found.add(kind)
    return found


def test_moves_cover_exactly_the_transition_table():
    assert set(MOVES) == set(states.TRANSITIONS)


@pytest.mark.parametrize("move", sorted(states.TRANSITIONS))
def test_every_legal_move_with_real_files(tmp_path, move):
    before, after = move
    start = make(str(tmp_path / "before"), START[before])
    assert states.classify(start) == before
    result = make(str(tmp_path / "after"), MOVES[move](set(start)))
    assert states.classify(result) == after
    assert states.is_legal(before, after)
    assert states.maker(before, after) == states.TRANSITIONS[move][0]


def test_every_other_move_is_illegal():
    for before, after in itertools.product(states.STATES, repeat=2):
        legal = states.is_legal(before, after)
        if before == after:
            assert legal == (before in states.SELF_MOVES or before == S1)
        else:
            assert legal == ((before, after) in states.TRANSITIONS), (before, after)
    for before, after in [(S1, S4), (S1, S5), (S5, S4), (S4, S3), (S2, S5), (S2, S4),
                          (HELD, S4), (HELD, S2)]:
        assert not states.is_legal(before, after)
        assert states.maker(before, after) is None


def test_classify_is_unambiguous_for_every_set_of_files():
    for r in range(len(states.FILES) + 1):
        for present in itertools.combinations(states.FILES, r):
            state = states.classify(present)
            matching = [s for s in states.STATES
                        if all(need is None or need == (k in present) for k, need in states.PRESENCE[s].items())]
            assert matching == ([state] if state else [])


@pytest.mark.parametrize("present", [{"todo"}, {"info"}, {"intd"}, {"mess", "bounce"}, {"mess", "todo", "bounce"}])
def test_impossible_file_sets_have_no_state(present):
    assert states.classify(present) is None


def test_unknown_file_kind_is_an_error():
    with pytest.raises(ValueError):
        states.classify({"mess", "junk"})


def test_record_and_log_transitions_follow_legal_paths():
    for table in (states.RECORD_TRANSITIONS, states.LOG_EVENT_TRANSITIONS):
        for name, (before, after) in table.items():
            assert states.path_exists(before, after), name


def test_leftovers_are_cleanable_states():
    assert set(states.LEFTOVER_STATES) == {S2, S3}
    assert states.LEFTOVER_AGE == 129600
    for state in states.LEFTOVER_STATES:
        assert states.path_exists(state, S1)
