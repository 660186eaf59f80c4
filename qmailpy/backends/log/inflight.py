"""A message the log backend's qmail-send is working on ("in flight").

Its S5 state is its latest snapshot record plus the deltas appended since
(queue.py); only messages in flight are held in memory, in LogState.active
(state.py). An InFlight is built from a snapshot record by the part that puts the
message in flight (newwork.py, runners.py, commands.py, recovery.py) and changed by
deliveries.py, commands.py and recovery.py; it reads and writes no file.
"""


class InFlight:
    """A message qmail-send is working on: its snapshot state plus deltas since."""
    __slots__ = ("n", "snap", "sender", "birth", "qp", "uid", "size", "notes", "channels",
                 "passes", "offered", "delta_start", "failed", "held")

    def __init__(self, n, snap_pos, rec):
        self.n, self.snap = n, snap_pos
        f = rec.fields
        self.sender, self.birth, self.qp, self.uid, self.size = (
            f["sender"], f["birth"], f["qp"], f["uid"], f["size"])
        self.notes = bytearray(f["notes"])
        self.channels = {c: [due, [list(r) for r in rcpts]] for c, (due, rcpts) in f["channels"].items()}
        self.passes = set()          # channels with a START and no REPLACEMENT yet
        self.offered = set()         # channels (None = completion) handed to qmail-send
        self.delta_start = None      # position of the first delta after snap
        self.failed = False          # a bounce note since the last DELIVERY
        self.held = f.get("held", False)    # qmailctl queue hold: the runners skip it

    def channel_state(self):
        return {c: (due, [(bool(d), a) for d, a in rcpts]) for c, (due, rcpts) in self.channels.items()}

