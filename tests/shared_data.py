"""Where the project's read-only fixtures (shared/data: real C qmail logs and a queue
snapshot) are: beside the checkout as CI lays it out, else $QMAILPY_TEST_SHARED, else /work/shared."""
import os

import knobs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shared_dir():
    for candidate in (os.path.join(os.path.dirname(_ROOT), "shared"),
                      knobs.SHARED, "/work/shared"):
        if candidate and os.path.isdir(os.path.join(candidate, "data")):
            return candidate
    return None


SHARED = shared_dir()
DATA = os.path.join(SHARED, "data") if SHARED else None


def data_file(name):
    """Path of a shared/data file, or None when the fixtures are not reachable."""
    return os.path.join(DATA, name) if DATA else None
