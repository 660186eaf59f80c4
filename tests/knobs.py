"""The test suite's knobs: every environment variable the tests read, each named
QMAILPY_TEST_<NAME> and read here only (docs/testing.md "Knobs" lists them with what they do).

Depth knobs make the slow tests explore more; the rest keep what a run leaves or say where
the shared fixtures are. bin/test itself reads QMAILPY_TEST_JOBS.
"""
import os

PREFIX = "QMAILPY_TEST_"


def _text(name, default=""):
    return os.environ.get(PREFIX + name, default)


def _flag(name):
    return _text(name) == "1"


def _int(name, default):
    return int(_text(name, str(default)))


# tests/test_crash_states.py and tests/crashstates.py: the power-cut explorer
CRASHSTATES_FULL = _flag("CRASHSTATES_FULL")            # every state of every protocol
CRASHSTATES_CAP = _int("CRASHSTATES_CAP", 40)           # else an even spread of this many
CRASHSTATES_PAIRS = _int("CRASHSTATES_PAIRS", 25 if CRASHSTATES_FULL else 0)
CRASHSTATES_POSIX_APPENDS = _flag("CRASHSTATES_POSIX_APPENDS")

# tests/test_logqueue_records.py: every payload byte damaged, not every 4th
DAMAGE_FULL = _flag("DAMAGE_FULL")


def damage_seeds():
    """tests/test_logqueue_damage.py's seeds: QMAILPY_TEST_DAMAGE_SEEDS=LOW-HIGH (default 1-2)."""
    low, _, high = _text("DAMAGE_SEEDS", "1-2").partition("-")
    return range(int(low), int(high or low) + 1)


# tests/test_logqueue_send_crash.py: SIGKILLs of qmail-send
SENDCRASH_TIMEOUT = _int("SENDCRASH_TIMEOUT", 60)       # seconds per kill run
SENDCRASH_LOAD_N = _int("SENDCRASH_LOAD_N", 1000)       # messages under the random kills
SENDCRASH_LOAD_SEED = _int("SENDCRASH_LOAD_SEED", 5)

# tests/conftest.py: keep every test home and print its path
KEEP_HOMES = bool(_text("KEEP_HOMES"))

# tests/shared_data.py: where shared/data is when it is not beside the checkout
SHARED = _text("SHARED")

# tests/send_harness.py: collect each home's log and snapshot into this directory for
# qmail-audit (set by tests/test_audit.py and tests/test_queue_audit.py for their runs)
AUDIT_COLLECT_ENV = PREFIX + "AUDIT_COLLECT"
