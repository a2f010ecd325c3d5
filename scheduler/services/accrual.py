"""Attained service (MLFQ's weighted GPU-seconds) of running work: computed every tick, written lazily.

Every tick computes each running workload's service up to now from its row:
``attained_service`` as of ``accrued_at`` (or, before the first write of this
run, as of ``started_at``: a placement clears ``accrued_at``), plus cards x
seconds since, at ``idle_weight`` of the rate while its measured utilization is
below ``idle_util`` and at the full rate without a reading (the policy's
``service_rate``). The policy decides on those values.

Writing them back for every running workload at every tick (5,000 rows) took
~200 ms of PostgreSQL time per tick: the pages are full, so no update is HOT and
every index is touched. So a tick writes only the rows last written
ACCRUAL_WRITE_S ago or more (the oldest first, at most ACCRUAL_WRITES_PER_TICK)
and those whose queue level changed. What that changes: the utilization at a
write weighs the whole time since the previous one (at most about
ACCRUAL_WRITE_S; the utilization is itself a per-minute mean), and work that
stops loses the service of the time since its last write, as it lost the time
since the last tick before.

A write adds the service to the column (``attained_service + delta``): a value
set since the tick read the row is kept. Only the tick writes these columns
(one tick at a time). Given the row versions the tick read (``version``, on
PostgreSQL), a write skips rows written since (the next tick reads them again
and writes them then) and returns what it wrote with the rows' new versions, so
that the tick's kept rows (``scheduler.holding``) stay current without reading
them again: the accrual writes hundreds of rows a tick.
"""

from dataclasses import dataclass
from datetime import datetime

from scheduler.models import Workload, WorkloadStatus, card_share
from scheduler.policy.mlfq import service_rate
from scheduler.services.bulk import rows_update

ACCRUAL_WRITE_S = 60.0
ACCRUAL_WRITES_PER_TICK = 500


@dataclass(eq=False, slots=True)
class Accrued:
    """One holding workload's service up to the tick's time, and what a write would set on its row."""

    pk: int
    attained: float  # the service the policy sees: the row's value plus ``attained_service``
    attained_service: float  # the service to add to the row's value
    accrued_at: datetime | None  # the tick's time for running work; None for other work (no service accrues)
    queue_level: int
    since: float | None  # when what is in the row's value ends, in seconds since 1970 (None: nothing accrues)
    version: str | None = None  # the row's version as read (``scheduler.holding``), where it has one


def service_accrue(
    rows, *, now: datetime, idle_util: float, idle_weight: float, kept: dict | None = None
) -> dict[int, Accrued]:
    """Each holding row's service up to ``now``, by id; nothing is written.

    ``rows``: ``selectors.holding_rows``: ``pk``, ``status``, ``no_gpu``, ``gpu_count``, ``gpu_milli``,
    ``gpu_utilization``, ``attained_service``, ``queue_level``, and ``accrued_s`` and ``started_s`` (times in
    seconds since 1970). ``kept``: a dict the caller keeps from one call to the next (the tick's; for the same
    ``idle_util`` and ``idle_weight``): the ``Accrued`` of a row that is the same object as at the last call
    (``scheduler.holding`` keeps the objects of unchanged rows: thousands a tick) is brought to ``now`` in place,
    not built again, with the rate it had; entries of rows no longer given are dropped."""
    now_s = now.timestamp()
    accrued = {}
    running = WorkloadStatus.RUNNING
    kept_get = {}.get if kept is None else kept.get
    for w in rows:
        entry = kept_get(w.pk)
        if entry is not None and entry[0] is w:
            _, a, rate = entry
            a.queue_level = w.queue_level  # ``service_record`` sets the level it writes; the row keeps its own
            if rate:
                a.attained_service = delta = rate * max(now_s - a.since, 0.0)
                a.attained, a.accrued_at = w.attained_service + delta, now
            accrued[w.pk] = a
            continue
        version = getattr(w, "version", None)
        since = w.accrued_s or w.started_s
        if w.status == running and since is not None and not w.no_gpu:  # no cards held: no service
            rate = card_share(w.gpu_count, w.gpu_milli) * service_rate(
                w.gpu_utilization, idle_util=idle_util, idle_weight=idle_weight
            )
            delta = rate * max(now_s - since, 0.0)
            a = accrued[w.pk] = Accrued(w.pk, w.attained_service + delta, delta, now, w.queue_level, since, version)
        else:
            rate = 0.0
            a = accrued[w.pk] = Accrued(w.pk, w.attained_service, 0.0, None, w.queue_level, None, version)
        if kept is not None:
            kept[w.pk] = (w, a, rate)
    if kept is not None and len(kept) > len(accrued):
        for pk in kept.keys() - accrued.keys():
            del kept[pk]
    return accrued


def service_record(
    accrued: dict[int, Accrued], levels: dict, *, now: datetime, version: str | None = None, returning=None
) -> list:
    """Write the service of rows whose last write is ACCRUAL_WRITE_S old or more (oldest first, at most
    ACCRUAL_WRITES_PER_TICK), and the service and new level of rows whose level changed (``levels``: the
    policy's level by id), in one statement. ``version`` (an SQL expression of a row's version) and
    ``returning``: as ``bulk.rows_update`` has them: only rows still at the version read are written, and
    what ``returning`` names of each row written comes back."""
    changed = {}
    for a in accrued.values():
        level = levels.get(a.pk, a.queue_level)
        if level != a.queue_level:
            a.queue_level = level
            changed[a.pk] = a
    cutoff = now.timestamp() - ACCRUAL_WRITE_S
    stale = sorted(
        (a for a in accrued.values() if a.since is not None and a.since <= cutoff and a.pk not in changed),
        key=lambda a: a.since,
    )
    written = [*changed.values(), *stale[:ACCRUAL_WRITES_PER_TICK]]
    fields = ["accrued_at", "queue_level"]
    return rows_update(Workload, written, fields, add=("attained_service",), version=version, returning=returning)
