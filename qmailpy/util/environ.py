"""Setting a worker's whole environment between jobs, touching only what differs.

A session or delivery worker serves job after job in one process, and each job
must start with exactly the environment it would have had in a process of its
own. Clearing os.environ and filling it again costs an unsetenv and a putenv per
variable (about 80 calls for a typical environment, a third of a short SMTP
session's CPU); from one job to the next only a few variables differ. Reading
os.environ back to compare costs nearly as much (each name and value is decoded),
so a worker passes what it installed last time, when nothing else in the worker
changes the environment between its jobs.
"""


def replace(mapping, wanted, held=None):
    """Make mapping (os.environ or os.environb) hold exactly wanted's variables; a copy of
    wanted is returned, for the next call's held. held: what mapping is known to hold
    now (None: read it)."""
    if held is None:
        held = dict(mapping)
    for name in held.keys() - wanted.keys():
        del mapping[name]
    for name, value in wanted.items():
        if held.get(name) != value:
            mapping[name] = value
    return dict(wanted)
