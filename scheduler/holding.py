"""What the tick reads of the cluster every tick, kept from one tick to the next in the tick's process: the work
holding resources (its rows and the cards each holds) and the cards' free capacity.

Every tick needs every holding workload's row and the cards it holds (5,000 and 7,500 rows on 1,000
nodes), and every card of every active node (8,000); between two ticks a few hundred of them change
(placements, departures, the accrual's writes, utilization readings). PostgreSQL says which. For the
holding rows: a row's ``xmin`` (the transaction that wrote its current version) with its ``ctid`` (where
that version lies) differ for every version of a row — a later transaction has a later ``xmin``, and a
second version written by the same transaction lies elsewhere (the first cannot be reclaimed while that
transaction is open). So a read takes (id, version) of every row, and the whole row only where the version
differs from the one kept (the accrual's own writes return their new versions: ``rows_written``). For the
cards: only the rows written since the last read's horizon (``CapacityCache``).

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

import functools
import time
from collections import defaultdict

from django.db import connection
from django.db.models.expressions import RawSQL

from scheduler.models import Allocation, Workload, WorkloadStatus
from scheduler.policy import CardSpec, ClusterState, NodeSpec
from scheduler.selectors import EpochSeconds, capacity_nodes, card_specs, driver_rows, holding_rows, id_in

WHOLE_READ_S = 300.0


def row_version(table: str) -> str:
    """SQL of a row's version (its ``xmin`` with its ``ctid``), qualified: a query may join other tables."""
    return f"{table}.xmin::text || {table}.ctid::text"


WORKLOAD_VERSION = row_version("scheduler_workload")
# What the accrual's write (``services.accrual.service_record``) returns of each row it wrote, as
# ``selectors.holding_rows`` names and reads it: the kept row is brought to its new version without a read.
ACCRUAL_RETURNING = {
    "version": WORKLOAD_VERSION,
    "attained_service": "scheduler_workload.attained_service",
    "queue_level": "scheduler_workload.queue_level",
    "accrued_s": EpochSeconds.template % {"expressions": "scheduler_workload.accrued_at"},
}


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
            versions = holding.annotate(version=RawSQL(WORKLOAD_VERSION, ())).order_by("pk")
            now = dict(driver_rows(versions.values_list("pk", "version")))
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

    def write_guard(self) -> dict:
        """What a write of kept rows by the tick (the accrual: ``bulk.rows_update``) passes so that the rows stay
        kept: write only rows still at the version read, and return their new versions and the columns written
        (``rows_written``). Nothing on SQLite, which reads whole every tick."""
        if connection.vendor != "postgresql":
            return {}
        return {"version": WORKLOAD_VERSION, "returning": ACCRUAL_RETURNING}

    def rows_written(self, written: list[tuple]) -> None:
        """Bring the kept rows the tick itself wrote (``write_guard``'s returned rows) to their new versions:
        each was still at the version kept, so only the columns written changed."""
        for pk, *values in written:
            row = self.rows.get(pk)
            if row is not None:
                columns = list(row)  # set by place: a third of ``_replace``'s time, for hundreds of rows a tick
                for at, value in zip(_returning_at(row._fields), values, strict=True):
                    columns[at] = value
                self.rows[pk] = row._make(columns)


@functools.cache
def _returning_at(fields: tuple[str, ...]) -> tuple[int, ...]:
    """Where the columns the accrual's write returns (``ACCRUAL_RETURNING``) are in a holding row of these fields."""
    return tuple(fields.index(name) for name in ACCRUAL_RETURNING)


class CapacityCache:
    """The free capacity of the active nodes (``selectors.cluster_capacity``), each card kept until its row is
    written again.

    Which cards were written since the last read, PostgreSQL says without a pass over all 8,000: every row version
    a read may not have seen was written by a transaction numbered at or above that read's horizon (the oldest
    transaction still open just before it: ``_mark``), so the next read takes only the rows whose ``xmin`` is at or
    above it (and some it had seen, written by transactions that ended meanwhile). Transaction ids are 32 bits in a
    row: a read is whole when the count wraps between two reads, when the cards' number or ids changed (a row
    deleted leaves no version behind), every ``WHOLE_READ_S`` and on SQLite."""

    def __init__(self):
        self.cards: dict[int, tuple[int, int, CardSpec]] = {}  # id -> (node id, index, spec), in card order
        self.nodes: set[int] = set()  # the nodes whose cards are kept (those active at the last read)
        self.mark: tuple[int, tuple] | None = None  # the last read's (horizon, (number of cards, sum of their ids))
        self.last_whole: float | None = None
        self.last_changed = 0  # cards read by the last read
        self.kept_state: ClusterState | None = None
        self.scores: dict = {}  # what the policy cached on the states handed out (``ClusterState.score_cache``)

    def state(self) -> ClusterState:
        """The capacity as the policy's ``ClusterState``, to change at will: a copy of one kept across reads, in
        which only the nodes' own capacity and the cards read again are rewritten (building it from 8,000 cards
        took ~20 ms of every tick); built again where a card or a node came, went or moved. The scores the policy
        cached on the last copy come with it (FGD scored each request's shape on all 1,000 nodes every tick, ~6,000
        of the ~7,000 nodes it scored a tick): only the nodes whose capacity changed since are scored again."""
        nodes, fresh = self._read()
        state = None if fresh is None else self.kept_state
        if state is not None:
            state.nodes_set(nodes)
            if not all(state.card_set(state.node_index[node], index, card) for node, index, card in fresh):
                state = None
        if state is None:
            state = self.kept_state = ClusterState(self._with_cards(nodes))
            self.scores = {}
        scratch = state.copy()
        scratch.score_cache = self.scores  # versions are never given twice: a score of an unchanged node holds
        return scratch

    def read(self) -> list[NodeSpec]:
        """Every active node's free capacity with its cards, as of now."""
        nodes, _ = self._read()
        self.kept_state = None  # it missed this read's cards
        return self._with_cards(nodes)

    def _with_cards(self, nodes: list[NodeSpec]) -> list[NodeSpec]:
        """``nodes`` (as ``_read`` gave them, without cards) with their cards: only where a state is built from them
        (8,000 cards appended took a few milliseconds of every tick that only rewrites the kept state)."""
        by_id = {node.id: node for node in nodes}
        for node, _, card in self.cards.values():
            by_id[node].cards.append(card)
        return nodes

    def _read(self) -> tuple[list[NodeSpec], list | None]:
        """The nodes (without their cards, which ``self.cards`` holds: ``_with_cards``), and the cards read again
        where every card kept its place (node, index) and the nodes stayed the same (what ``state`` rewrites in the
        state it keeps); None where places may have changed."""
        nodes = capacity_nodes()
        mark, now_xid = _mark() if connection.vendor == "postgresql" else (None, None)
        if _whole_due(self.last_whole) or self.mark is None or not _same_epoch(self.mark[0], now_xid):
            whole = True
        else:
            whole = mark[1] != self.mark[1]  # a card added or deleted
        unmoved = None
        if whole:
            self.last_whole = time.monotonic()
            self.cards = {card.id: (node, index, card) for node, index, card in card_specs(nodes)}
            self.last_changed = len(self.cards)
        else:
            fresh = card_specs(nodes, written_since=self.mark[0] & XID_MASK, of_nodes=list(nodes.keys() - self.nodes))
            moved = False  # a card new, or at another place (node, index): the order is worked out again
            for entry in fresh:
                kept = self.cards.get(entry[2].id)
                moved = moved or kept is None or kept[:2] != entry[:2]
                self.cards[entry[2].id] = entry
            if moved or nodes.keys() != self.nodes:  # or a node came or went
                kept = (entry for entry in self.cards.values() if entry[0] in nodes)
                self.cards = {entry[2].id: entry for entry in sorted(kept, key=lambda entry: entry[:2])}
            else:
                unmoved = fresh
            self.last_changed = len(fresh)
        self.mark, self.nodes = mark, set(nodes)
        return list(nodes.values()), unmoved


XID_MASK = (1 << 32) - 1


def _mark() -> tuple[tuple[int, tuple], int]:
    """((the horizon: the oldest transaction still open, as a 64-bit id; the cards' number and the sum of their
    ids: a card deleted changes both, one deleted and one added the sum), the next transaction's 64-bit id): read
    before the cards, in a statement of its own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, c.count, c.sum "
            "FROM pg_current_snapshot() AS s, (SELECT count(*), sum(id) FROM scheduler_gpu) AS c"
        )
        horizon, next_xid, count, ids = cursor.fetchone()
    return (horizon, (count, ids)), next_xid


def _same_epoch(horizon: int, next_xid: int) -> bool:
    """Whether the 32-bit ids in rows compare as their 64-bit ids from ``horizon`` up to ``next_xid``."""
    return horizon >> 32 == next_xid >> 32


HOLDING = HoldingCache()  # the tick's own, in the process that runs it
CAPACITY = CapacityCache()
