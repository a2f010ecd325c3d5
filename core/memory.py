"""Memory housekeeping shared by the long batch jobs (the scheduler's tick, billing's settlement)."""

import contextlib
import gc
import time

UNFREEZE_S = 600.0  # how long frozen objects stay out of the collector's reach (``collector_paused(freeze=True)``)
_unfrozen_at = [time.monotonic()]


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False):
    """Python's cyclic garbage collector off for the block (if it was on).

    A batch job makes many objects that live until it ends (a tick: ~60,000 rows, works and requests;
    a settlement: ~250,000 lines and postings). To the collector they look long-lived, so it runs full
    collections over the whole process again and again while they pile up (a third of a steady tick;
    1.4 s of a 3.3 s settlement's rating). What the block makes is freed by reference counting when
    it ends; the collector runs again from then on. Process-wide: other threads' cyclic garbage waits
    for the block's end too.

    ``freeze`` (the tick): at the block's end, what is cyclic garbage is collected and what survives is frozen
    (``gc.freeze``), so that later full collections leave it out. The tick keeps its state from tick to tick (the
    running works, the cards, the policy's scores: with Django and Celery ~200,000 objects), and a full collection
    over them took 110-130 ms, landing on a tick every ten or so (the slowest tick of a steady run, 1.6-1.9x the
    median). The collection at the block's end scans only what was made since the last freeze (1-3 ms a tick).
    A frozen object that later becomes cyclic garbage is freed only when the frozen ones are handed back to the
    collector, every ``UNFREEZE_S`` (one full collection then)."""
    if not gc.isenabled():
        yield  # someone else paused it: theirs to turn back on, and no freezing of what they are making
        return
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            _collect_and_freeze()
        gc.enable()


def _collect_and_freeze() -> None:
    if time.monotonic() - _unfrozen_at[0] >= UNFREEZE_S:
        _unfrozen_at[0] = time.monotonic()
        gc.unfreeze()
    gc.collect()
    gc.freeze()
