"""Taking shares of cards for workloads, under row locks, many placements per transaction.

Lock order, everywhere: the workload rows (by id), then the node rows (by id),
then their card rows (by id); freeing (lifecycle.allocations_free) follows the
same order. The free capacity is re-checked under those locks, placement by
placement, so a stale plan (from the policy, or a racing worker) can only place
less, never over-allocate; the database's check constraints are the last line
behind that.
"""

from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from scheduler.models import WHOLE_CARD, Allocation, Gpu, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.services.bulk import rows_update
from scheduler.services.lifecycle import transitions_recorded

S = WorkloadStatus


@dataclass(frozen=True)
class Share:
    gpu_id: int
    milli: int
    memory_mb: int


@dataclass(frozen=True)
class Placement:
    workload: Workload
    node_id: int
    shares: list[Share]
    queue_level: int | None = None  # the level the tick decided at, recorded with the placement


def allocation_create(*, workload: Workload, node_id: int, shares: list[Share]) -> bool:
    """Take ``shares`` on node ``node_id`` for ``workload`` and move it from queued to starting.

    Returns False, writing nothing, when the capacity is no longer there or the
    workload is no longer queued.
    """
    placed = allocations_create([Placement(workload, node_id, shares)])
    if placed:
        workload.refresh_from_db()
    return bool(placed)


def allocations_create(placements: list[Placement]) -> list[Placement]:
    """Commit, in one transaction, every placement that still fits; returns those placed (now starting).

    A placement is skipped when its workload is no longer queued, its node is no
    longer active, or its node or cards no longer have the room (counting the
    placements before it in the list).
    """
    if not placements:
        return []
    try:
        with transaction.atomic():
            queued = set(
                Workload.objects.select_for_update()
                .filter(pk__in=[p.workload.pk for p in placements], status=S.QUEUED)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            nodes = {
                n.pk: n
                for n in Node.objects.select_for_update()
                .filter(pk__in={p.node_id for p in placements}, status=NodeStatus.ACTIVE)
                .order_by("pk")
            }
            cards = {
                c.pk: c
                for c in Gpu.objects.select_for_update()
                .filter(id__in={s.gpu_id for p in placements for s in p.shares})
                .order_by("id")
            }
            placed = [p for p in placements if p.workload.pk in queued and _take(p, nodes.get(p.node_id), cards)]
            if placed:
                _write(placed, nodes, cards)
    except IntegrityError:
        # A check constraint caught what the re-check above should have: treat as no fit.
        return []
    return placed


def _take(placement: Placement, node: Node | None, cards: dict) -> bool:
    """Subtract the placement from the locked rows in memory if it fits; False (nothing taken) if not."""
    workload = placement.workload
    if node is None:
        return False
    if node.cpu_cores - node.allocated_cpu < workload.held_cpu_cores:
        return False
    if node.memory_mb - node.allocated_memory_mb < workload.held_memory_mb:
        return False
    cards_asked = 0 if workload.no_gpu else workload.gpu_count
    if len({s.gpu_id for s in placement.shares}) != cards_asked or len(placement.shares) != cards_asked:
        return False
    if any(s.milli != workload.gpu_milli for s in placement.shares):
        return False  # exactly the share asked for (and billed), on as many distinct cards as asked
    for share in placement.shares:
        card = cards.get(share.gpu_id)
        if card is None or card.node_id != node.pk or card.model != workload.gpu_model:
            return False
        if card.allocated_milli + share.milli > WHOLE_CARD:
            return False
        if card.allocated_memory_mb + share.memory_mb > card.memory_mb:
            return False
    for share in placement.shares:
        cards[share.gpu_id].allocated_milli += share.milli
        cards[share.gpu_id].allocated_memory_mb += share.memory_mb
    node.allocated_cpu += workload.held_cpu_cores
    node.allocated_memory_mb += workload.held_memory_mb
    return True


def _write(placed: list[Placement], nodes: dict, cards: dict) -> None:
    touched_cards = {s.gpu_id for p in placed for s in p.shares}
    rows_update(Gpu, [cards[i] for i in touched_cards], ["allocated_milli", "allocated_memory_mb"])
    touched_nodes = {p.node_id for p in placed}
    rows_update(Node, [nodes[i] for i in touched_nodes], ["allocated_cpu", "allocated_memory_mb"])
    Allocation.objects.bulk_create(
        Allocation(workload_id=p.workload.pk, gpu_id=s.gpu_id, milli=s.milli, memory_mb=s.memory_mb)
        for p in placed
        for s in p.shares
    )
    now = timezone.now()
    workloads = []
    for p in placed:
        w = p.workload
        w.status, w.status_reason, w.status_changed_at = S.STARTING, f"placed on {nodes[p.node_id].name}", now
        w.node, w.started_at, w.finished_at, w.queue_position = nodes[p.node_id], None, None, None
        if p.queue_level is not None:
            w.queue_level = p.queue_level
        workloads.append(w)
    Workload.objects.filter(pk__in=[w.pk for w in workloads]).update(
        status=S.STARTING, status_changed_at=Now(), started_at=None, finished_at=None, queue_position=None
    )
    rows_update(Workload, workloads, ["status_reason", "node", "queue_level"])
    transitions_recorded(workloads, from_status=S.QUEUED)
