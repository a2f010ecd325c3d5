"""What the tick reads of the cluster every tick, kept from one tick to the next in the tick's process: the work
holding resources (its rows and the cards each holds) and the cards' free capacity.

Every tick needs every holding workload's row and the cards it holds (5,000 and 7,500 rows on 1,000
nodes), and every card of every active node (8,000); between two ticks a few hundred of them change
(placements, departures, the accrual's writes, utilization readings). PostgreSQL says which: a row's
``xmin`` (the transaction that wrote its current version) with its ``ctid`` (where that version lies)
differ for every version of a row — a later transaction has a later ``xmin``, and a second version written
by the same transaction lies elsewhere (the first cannot be reclaimed while that transaction is open). So a
read takes (id, version) of every row, and the whole row only where the version differs from the one kept.

A workload's cards change only with its row: ``allocations_create`` writes both in one transaction, and
``allocations_free`` runs inside its caller's compare-and-swap on the row. A card's share class (the size of
the fractions on it) changes only with its row: every allocation made or freed updates the card's
``allocated_milli`` in the same transaction. A read is whole anyway once every ``WHOLE_READ_S`` (a bound on
anything that breaks those rules, and on the 2^32 transactions after which an ``xmin`` repeats), and on
SQLite, which has no row versions. Nodes (1,000 rows) and the disk their tenants hold are read every tick.

Rows of different ticks' reads mix as rows of one tick's separate statements always did: the allocation
service re-checks every placement under its row locks, so a stale view makes a placement fail, never
over-allocates.
"""

import time
from collections import defaultdict

from django.db import connection
from django.db.models.expressions import RawSQL

from scheduler.models import Allocation, Gpu, Workload, WorkloadStatus
from scheduler.policy import CardSpec, NodeSpec
from scheduler.selectors import capacity_nodes, card_specs, holding_rows, id_in

WHOLE_READ_S = 300.0


def row_version(table: str) -> str:
    """SQL of a row's version (its ``xmin`` with its ``ctid``), qualified: a query may join other tables."""
    return f"{table}.xmin::text || {table}.ctid::text"


WORKLOAD_VERSION, CARD_VERSION = row_version("scheduler_workload"), row_version("scheduler_gpu")


def _whole_due(last_whole: float | None) -> bool:
    return connection.vendor != "postgresql" or last_whole is None or time.monotonic() - last_whole >= WHOLE_READ_S


def _changed(now: dict, kept: dict, version_of) -> list:
    """The ids of ``now`` (id -> version) kept with another version (``version_of`` a kept entry), or not kept."""
    return [pk for pk, version in now.items() if pk not in kept or version_of(kept[pk]) != version]


def _merged(kept: dict, now: dict, changed: list, fresh: dict) -> dict:
    """``kept`` brought to ``now``'s ids, in its order: an unchanged entry as kept, a changed one only as read whole
    (``fresh``): one that is not there (it left between the two reads) is gone."""
    changed = set(changed)
    return {pk: fresh[pk] if pk in changed else kept[pk] for pk in now if pk not in changed or pk in fresh}


class HoldingCache:
    """The holding rows (``selectors.holding_rows``) and their cards, by workload id, as of the last read."""

    def __init__(self):
        self.rows: dict[int, object] = {}  # named rows, with their ``version`` on PostgreSQL
        self.cards: dict[int, list[int]] = {}
        self.last_whole: float | None = None  # when the last whole read was (time.monotonic)
        self.last_changed = 0  # rows read whole by the last read (all of them on a whole read)

    def read(self) -> tuple[list, dict[int, list[int]]]:
        """Every holding row (by id), and the ids of the cards each holds (ascending), as of now."""
        postgresql = connection.vendor == "postgresql"
        whole = _whole_due(self.last_whole)
        if whole:
            self.last_whole = time.monotonic()
            rows = holding_rows(version=WORKLOAD_VERSION if postgresql else None)
            self.rows = {row.pk: row for row in rows}
            changed = list(self.rows)
        else:
            holding = Workload.objects.filter(status__in=WorkloadStatus.holding_resources())
            now = dict(
                holding.annotate(version=RawSQL(WORKLOAD_VERSION, ())).order_by("pk").values_list("pk", "version")
            )
            changed = _changed(now, self.rows, lambda row: row.version)
            fresh = {row.pk: row for row in holding_rows(ids=changed, version=WORKLOAD_VERSION)}
            self.rows = _merged(self.rows, now, changed, fresh)
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


class CapacityCache:
    """The free capacity of the active nodes (``selectors.cluster_capacity``), each card kept while its row is
    the same version."""

    def __init__(self):
        self.cards: dict[int, tuple[int, str | None, CardSpec]] = {}  # id -> (node id, version, spec), in card order
        self.last_whole: float | None = None
        self.last_changed = 0  # cards read whole by the last read

    def read(self) -> list[NodeSpec]:
        nodes = capacity_nodes()
        if _whole_due(self.last_whole):
            self.last_whole = time.monotonic()
            read_version = CARD_VERSION if connection.vendor == "postgresql" else None
            self.cards = {entry[2].id: entry for entry in card_specs(nodes, version=read_version)}
            self.last_changed = len(self.cards)
        else:
            # Every card's version, kept where its node is active (in Python: filtering 8,000 rows by an array of
            # 1,000 node ids in the database compares each row with each id, 11 ms), in card order.
            every = Gpu.objects.order_by("node_id", "index").annotate(version=RawSQL(CARD_VERSION, ()))
            now = {pk: version for pk, node, version in every.values_list("pk", "node_id", "version") if node in nodes}
            changed = _changed(now, self.cards, lambda kept: kept[1])
            fresh = {entry[2].id: entry for entry in card_specs(nodes, ids=changed, version=CARD_VERSION)}
            self.cards = _merged(self.cards, now, changed, fresh)
            self.last_changed = len(changed)
        for node, _, card in self.cards.values():
            nodes[node].cards.append(card)
        return list(nodes.values())


HOLDING = HoldingCache()  # the tick's own, in the process that runs it
CAPACITY = CapacityCache()
