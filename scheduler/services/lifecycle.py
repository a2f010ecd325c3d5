"""Status transitions of a workload: compare-and-swap, event row, signal after commit.

A workload holds allocations exactly while it is starting, running or
stopping; a transition out of those states frees them in the same transaction,
so no path can leave a share held by work that no longer runs.
"""

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from scheduler.models import Allocation, Gpu, Node, Workload, WorkloadEvent, WorkloadStatus
from scheduler.services.bulk import rows_insert
from scheduler.signals import workload_changed, workload_metering

HOLDING = set(WorkloadStatus.holding_resources())
log = logging.getLogger(__name__)


def workload_transition(
    workload: Workload,
    *,
    to: str,
    allowed_from,
    reason: str = "",
    at: datetime | None = None,
    where: dict | None = None,
    **fields,
) -> bool:
    """Move ``workload`` to ``to`` if it is in one of ``allowed_from`` (and its row matches ``where``).

    Returns False (and changes nothing) when the row is in another state,
    including when a concurrent writer moved it first. On success the
    in-memory object is refreshed. The change is recorded at the database's
    time, or at ``at`` (a database time) when it happened earlier than it can be
    written: a node cut off from the control plane reports when it stopped work.
    Work that leaves running ends any restart's claim on it.
    """
    row = Workload.objects.filter(pk=workload.pk).values_list("status", "node_id").first()
    current, held_on = row or (None, None)
    if current not in set(allowed_from):
        return False
    if current == WorkloadStatus.RUNNING and to != WorkloadStatus.RUNNING:
        fields.setdefault("restarting", False)
    with transaction.atomic():
        updated = Workload.objects.filter(pk=workload.pk, status=current, **(where or {})).update(
            status=to, status_reason=reason[:255], status_changed_at=at or Now(), **fields
        )
        if not updated:
            return False
        if current in HOLDING and to not in HOLDING:
            allocations_free(workload.pk, node_id=held_on)  # the node it held, even if ``fields`` clear it
        workload.status, workload.status_reason = to, reason[:255]
        transitions_recorded([workload], from_status=current, at=at)
    workload.refresh_from_db()
    return True


def transitions_recorded(workloads: list[Workload], *, from_status: str, at: datetime | None = None) -> None:
    """Write the event rows of transitions just made (each workload holds its new status and reason)
    and announce them after commit. Call inside the transaction that changed the rows.

    The events take the database's time (their column default), or ``at``."""
    fields = ["workload_id", "from_status", "to_status", "reason", *(["created_at"] if at is not None else [])]
    rows = [(w.pk, from_status, w.status, w.status_reason, *([at] if at is not None else [])) for w in workloads]
    recorded_at = rows_insert(WorkloadEvent, fields, rows, returning="created_at")  # one statement: one time
    payloads = [
        dict(
            workload_id=w.pk,
            owner_id=w.owner_id,
            kind=w.kind,
            group_id=w.group_id,
            from_status=from_status,
            to_status=w.status,
            reason=w.status_reason,
            at=recorded_at,
        )
        for w in workloads
    ]
    transaction.on_commit(lambda: [workload_changed_send(payload) for payload in payloads], robust=True)


def workload_changed_send(payload: dict) -> None:
    """Tell every receiver, each on its own: one that fails (Redis down for the live push or the
    tick wake-up) is logged and never keeps the others (billing's metering) from running."""
    for receiver, error in workload_changed.send_robust(sender=Workload, **payload):
        if isinstance(error, Exception):
            log.error("receiver %s of workload %s failed: %r", receiver, payload["workload_id"], error)


def allocations_free(workload_id: int, *, node_id: int | None = None, member_node_id: int | None = None) -> None:
    """Give back every share the workload holds, and its CPU and memory on each node that holds its cards
    (a gang's members: one per node), or on ``node_id`` (default its node) when it holds no card;
    ``member_node_id``: only what it holds on that node (an elastic gang's member that left while it runs on).
    Call inside a transaction."""
    allocations = Allocation.objects.filter(workload_id=workload_id).select_related("gpu")
    if member_node_id is not None:
        allocations = allocations.filter(gpu__node_id=member_node_id)
    allocations = list(allocations)
    workload = Workload.objects.only("node_id", "cpu_cores", "memory_mb", "no_gpu").get(pk=workload_id)
    if node_id is not None:
        workload.node_id = node_id
    # Work started without cards holds only CPU and memory (no allocation rows); this runs once per
    # leaving the holding states (the caller's compare-and-swap), so it is freed once.
    if not allocations and not (workload.no_gpu and workload.node_id):
        return
    node_ids = sorted({a.gpu.node_id for a in allocations} or {workload.node_id})
    # Lock order everywhere: the workload row (updated by the caller), its nodes by id, its cards by id.
    list(Node.objects.select_for_update().filter(pk__in=node_ids).order_by("pk"))
    list(Gpu.objects.select_for_update().filter(id__in=[a.gpu_id for a in allocations]).order_by("id"))
    for a in allocations:
        Gpu.objects.filter(id=a.gpu_id).update(
            allocated_milli=F("allocated_milli") - a.milli, allocated_memory_mb=F("allocated_memory_mb") - a.memory_mb
        )
    Node.objects.filter(pk__in=node_ids).update(
        allocated_cpu=F("allocated_cpu") - workload.held_cpu_cores,
        allocated_memory_mb=F("allocated_memory_mb") - workload.held_memory_mb,
    )
    gone = Allocation.objects.filter(workload_id=workload_id)
    (gone if member_node_id is None else gone.filter(pk__in=[a.pk for a in allocations])).delete()


def workload_meter_change(workload: Workload, change: str, reason: str, *, at=None) -> None:
    """Pause or resume a running workload's meter (``MeterChange``) at ``at`` (default: now), as an event of its
    own; billing follows it after commit (``signals.workload_metering``)."""
    event = WorkloadEvent.objects.create(
        workload_id=workload.pk,
        from_status=WorkloadStatus.RUNNING,
        to_status=WorkloadStatus.RUNNING,
        reason=reason[:255],
        meter=change,
        **({"created_at": at} if at is not None else {}),
    )
    event.refresh_from_db(fields=["created_at"])
    transaction.on_commit(
        lambda: workload_metering.send_robust(
            sender=WorkloadEvent, workload_id=workload.pk, change=change, at=event.created_at
        )
    )


def workload_note(workload_id: int, reason: str) -> None:
    """Record something that happened to the work without changing its status (an event from and to it)."""
    status = Workload.objects.filter(pk=workload_id).values_list("status", flat=True).first()
    if status is not None:
        WorkloadEvent.objects.create(workload_id=workload_id, from_status=status, to_status=status, reason=reason[:255])
