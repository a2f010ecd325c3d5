"""Taking shares of cards for a workload, under row locks.

Lock order, everywhere: the node row, then its card rows ordered by id. The
free capacity is re-checked under those locks, so a stale snapshot (from the
policy, or from a racing worker) can never over-allocate; the database's check
constraints are the last line behind that.
"""

from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F

from scheduler.models import WHOLE_CARD, Allocation, Gpu, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.services.lifecycle import workload_transition


@dataclass(frozen=True)
class Share:
    gpu_id: int
    milli: int
    memory_mb: int


def allocation_create(*, workload: Workload, node_id: int, shares: list[Share]) -> bool:
    """Take ``shares`` on node ``node_id`` for ``workload`` and move it from queued to starting.

    Returns False, writing nothing, when the capacity is no longer there or
    the workload is no longer queued.
    """
    try:
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=node_id, status=NodeStatus.ACTIVE).first()
            if node is None:
                return False
            if node.cpu_cores - node.allocated_cpu < workload.cpu_cores:
                return False
            if node.memory_mb - node.allocated_memory_mb < workload.memory_mb:
                return False
            card_ids = sorted(share.gpu_id for share in shares)
            cards = {c.id: c for c in Gpu.objects.select_for_update().filter(id__in=card_ids, node=node).order_by("id")}
            if len(cards) != len(card_ids):
                return False
            for share in shares:
                card = cards[share.gpu_id]
                if card.model != workload.gpu_model:
                    return False
                if card.allocated_milli + share.milli > WHOLE_CARD:
                    return False
                if card.allocated_memory_mb + share.memory_mb > card.memory_mb:
                    return False
            if not workload_transition(
                workload,
                to=WorkloadStatus.STARTING,
                allowed_from=[WorkloadStatus.QUEUED],
                reason=f"placed on {node.name}",
                node=node,
                started_at=None,
                finished_at=None,
            ):
                return False
            for share in shares:
                Gpu.objects.filter(id=share.gpu_id).update(
                    allocated_milli=F("allocated_milli") + share.milli,
                    allocated_memory_mb=F("allocated_memory_mb") + share.memory_mb,
                )
                Allocation.objects.create(
                    workload=workload, gpu_id=share.gpu_id, milli=share.milli, memory_mb=share.memory_mb
                )
            Node.objects.filter(pk=node.pk).update(
                allocated_cpu=F("allocated_cpu") + workload.cpu_cores,
                allocated_memory_mb=F("allocated_memory_mb") + workload.memory_mb,
            )
    except IntegrityError:
        # A check constraint caught what the re-check above should have: treat as no fit.
        workload.refresh_from_db()
        return False
    return True
