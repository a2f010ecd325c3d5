"""The work holding resources as the tick reads it, kept from one tick to the next in the tick's process.

Every tick needs every holding workload's row and the cards it holds (5,000 and 7,500 rows on 1,000
nodes); between two ticks a few hundred of them change (placements, departures, the accrual's writes,
utilization readings). PostgreSQL says which: a row's ``xmin`` (the transaction that wrote its current
version) with its ``ctid`` (where that version lies) differ for every version of a row — a later
transaction has a later ``xmin``, and a second version written by the same transaction lies elsewhere
(the first cannot be reclaimed while that transaction is open). So a read takes (id, version) of every
holding row, and the whole row, and the cards it holds, only where the version differs from the one kept.

A workload's cards change only with its row: ``allocations_create`` writes both in one transaction, and
``allocations_free`` runs inside its caller's compare-and-swap on the row. Every ``FULL_READ_EVERY``-th
read is whole anyway (a bound on anything that breaks that rule, and on the 2^32 transactions after
which an ``xmin`` repeats), and so is every read on SQLite, which has no row versions.

Rows of different ticks' reads mix as rows of one tick's separate statements always did: the allocation
service re-checks every placement under its row locks, so a stale view makes a placement fail, never
over-allocates.
"""

from collections import defaultdict

from django.db import connection
from django.db.models.expressions import RawSQL

from scheduler.models import Allocation, Workload, WorkloadStatus
from scheduler.selectors import holding_rows, id_in

FULL_READ_EVERY = 100  # reads; ~a minute of a busy tick
VERSION = "xmin::text || ctid::text"


class HoldingCache:
    """The holding rows (``selectors.holding_rows``) and their cards, by workload id, as of the last read."""

    def __init__(self):
        self.rows: dict[int, object] = {}  # named rows, with their ``version`` on PostgreSQL
        self.cards: dict[int, list[int]] = {}
        self.reads = 0
        self.last_changed = 0  # rows read whole by the last read (all of them on a whole read)

    def read(self) -> tuple[list, dict[int, list[int]]]:
        """Every holding row (by id), and the ids of the cards each holds (ascending), as of now."""
        postgresql = connection.vendor == "postgresql"
        whole = not postgresql or self.reads % FULL_READ_EVERY == 0
        self.reads += 1
        if whole:
            rows = holding_rows(version=VERSION if postgresql else None)
            self.rows = {row.pk: row for row in rows}
            changed = list(self.rows)
        else:
            holding = Workload.objects.filter(status__in=WorkloadStatus.holding_resources())
            now = dict(holding.annotate(version=RawSQL(VERSION, ())).order_by("pk").values_list("pk", "version"))
            changed = [pk for pk, version in now.items() if pk not in self.rows or self.rows[pk].version != version]
            fresh = {row.pk: row for row in holding_rows(ids=changed, version=VERSION)}
            # In id order; a row that stopped holding between the two reads is gone from ``fresh``.
            kept = self.rows
            self.rows = {pk: fresh.get(pk) or kept[pk] for pk in now if pk in fresh or pk in kept}
        self._cards_read(changed, whole=whole)
        self.last_changed = len(changed)
        return list(self.rows.values()), self.cards

    def _cards_read(self, changed: list[int], *, whole: bool) -> None:
        held: dict[int, list[int]] = defaultdict(list)
        if whole:
            rows = Allocation.objects.filter(workload__status__in=WorkloadStatus.holding_resources())
        else:  # the changed rows are holding ones (as read a moment ago): by the index on workload_id
            rows = Allocation.objects.filter(id_in("scheduler_allocation.workload_id", changed))
        for workload_id, gpu_id in rows.order_by("gpu_id").values_list("workload_id", "gpu_id"):
            held[workload_id].append(gpu_id)
        changed = set(changed)
        kept = {} if whole else self.cards
        self.cards = {pk: held.get(pk, []) if pk in changed else kept.get(pk, []) for pk in self.rows}


HOLDING = HoldingCache()  # the tick's own, in the process that runs it
