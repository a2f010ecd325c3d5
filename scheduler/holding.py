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
            changed = [pk for pk, version in now.items() if pk not in self.rows or self.rows[pk].version != version]
            fresh = {row.pk: row for row in holding_rows(ids=changed, version=WORKLOAD_VERSION)}
            # In id order; a changed row only as read now (one that stopped holding since the first read is gone).
            kept, was_changed = self.rows, set(changed)
            self.rows = {
                pk: fresh[pk] if pk in was_changed else kept[pk] for pk in now if pk not in was_changed or pk in fresh
            }
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
        # card id -> (node id, index, version, spec), in (node, index) order
        self.cards: dict[int, tuple[int, int, str | None, CardSpec]] = {}
        self.last_whole: float | None = None
        self.last_changed = 0  # cards read whole by the last read

    def read(self) -> list[NodeSpec]:
        nodes = capacity_nodes()
        if _whole_due(self.last_whole):
            self.last_whole = time.monotonic()
            read_version = CARD_VERSION if connection.vendor == "postgresql" else None
            self.cards = {kept[3].id: kept for kept in card_specs(node_ids=list(nodes), version=read_version)}
            self.last_changed = len(self.cards)
        else:
            # Every card's, kept where its node is active: filtering 8,000 rows by an array of 1,000 node ids in
            # the database compares each row with each id (11 ms; 1 ms here).
            every = (
                Gpu.objects.order_by()
                .annotate(version=RawSQL(CARD_VERSION, ()))
                .values_list("pk", "node_id", "version")
            )
            versions = {pk: version for pk, node, version in every if node in nodes}
            changed = [pk for pk, version in versions.items() if pk not in self.cards or self.cards[pk][2] != version]
            fresh = {kept[3].id: kept for kept in card_specs(ids=changed, version=CARD_VERSION)}
            kept, was_changed = self.cards, set(changed)
            self.cards = {
                pk: fresh[pk] if pk in was_changed else kept[pk]
                for pk in kept
                if pk in versions and (pk not in was_changed or pk in fresh)
            }
            if fresh.keys() - self.cards.keys():  # cards of a node that came (back): in (node, index) order
                self.cards.update(fresh)
                self.cards = dict(sorted(self.cards.items(), key=lambda item: item[1][:2]))
            self.last_changed = len(changed)
        for node, _, _, card in self.cards.values():
            nodes[node].cards.append(card)
        return list(nodes.values())


HOLDING = HoldingCache()  # the tick's own, in the process that runs it
CAPACITY = CapacityCache()
