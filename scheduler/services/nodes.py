"""Nodes through their life: registration, heartbeats, rejoining, and the operator's drain and remove.

Control-plane code: it takes what a node agent reports (``GpuInfo``) and never
imports the GPU-host side (``agent``). Silent nodes: ``node_loss``.
Times are the database's (``core.clock``).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from core.clock import db_now
from core.errors import Conflict, InvalidInput
from core.relay import relay_base
from scheduler.models import Gpu, MeterChange, Node, NodeStatus, Workload, WorkloadEvent, WorkloadKind, WorkloadStatus
from scheduler.services.lifecycle import workload_meter_change, workload_transition

S = WorkloadStatus


@dataclass(frozen=True)
class GpuInfo:
    """One card as its host reports it when it registers (NVML, or the simulated inventory)."""

    index: int
    uuid: str
    model: str
    memory_mb: int


def node_register(
    *,
    name: str,
    hostname: str,
    address: str = "",
    relay_url: str = "",
    relay_tls_sha256: str = "",
    cpu_cores: int,
    memory_mb: int,
    disk_gb: int | None = None,
    gpus: list[GpuInfo],
    simulated: bool,
    nvidia_runtime: bool,
    docker_version: str = "",
) -> Node:
    """Create or refresh a node and its cards, under a new epoch; it is active from now on, unless an
    operator is draining it (or drained it): an agent's restart does not take it back into service.

    Call after the agent has fenced the host (``agent_reconcile``): nothing may run
    there that the database does not assign to it. A ``relay_url`` not at ``address``
    (``core.relay.relay_base``), or served over TLS without its certificate's ``relay_tls_sha256``,
    is refused: InvalidInput, and nothing is stored.
    """
    if relay_url:
        try:
            relay_base(node=name, address=address, relay_url=relay_url, tls_sha256=relay_tls_sha256)
        except ValueError as exc:
            raise InvalidInput(str(exc), field="relay_url") from None
    with transaction.atomic():
        kept = (
            Node.objects.select_for_update()
            .filter(name=name, status__in=[NodeStatus.DRAINING, NodeStatus.DRAINED])
            .values("status", "drain_deadline")
            .first()
        )
        node, _ = Node.objects.select_for_update().update_or_create(
            name=name,
            defaults=dict(
                hostname=hostname,
                address=address,
                relay_url=relay_url,
                relay_tls_sha256=relay_tls_sha256 if relay_url else "",
                cpu_cores=cpu_cores,
                memory_mb=memory_mb,
                disk_gb=disk_gb,
                simulated=simulated,
                nvidia_runtime=nvidia_runtime,
                docker_version=docker_version,
                last_heartbeat=Now(),
                **(kept or {"status": NodeStatus.ACTIVE, "drain_deadline": None}),
            ),
        )
        Node.objects.filter(pk=node.pk).update(epoch=F("epoch") + 1)
        node.refresh_from_db()
        seen = []
        for gpu in gpus:
            card, _ = Gpu.objects.update_or_create(
                uuid=gpu.uuid, defaults=dict(node=node, index=gpu.index, model=gpu.model, memory_mb=gpu.memory_mb)
            )
            seen.append(card.pk)
        # Cards that vanished from the host go, unless work still holds them.
        node.gpus.exclude(pk__in=seen).filter(allocations__isnull=True).delete()
    return node


def node_heartbeat(*, name: str, epoch: int, disk: tuple[int, int] | None = None) -> str | None:
    """Record that the node's agent (of this epoch) is alive, with its disk's (total, free) GB when measured;
    returns the node's status.

    None: a newer agent registered this node, so this one must stop. A lost node
    stays lost here: it rejoins through ``node_rejoin`` once it has fenced itself.
    A removed node's agent stops.
    """
    measured = {"disk_total_gb": disk[0], "disk_free_gb": disk[1]} if disk else {}
    updated = Node.objects.filter(name=name, epoch=epoch).update(last_heartbeat=Now(), **measured)
    if not updated:
        return None
    return Node.objects.filter(name=name).values_list("status", flat=True).first()


def node_rejoin(*, name: str, epoch: int) -> bool:
    """A lost node whose agent has stopped every container not assigned to it is active again: the instances it
    still runs are charged again from now (their meter paused when it was lost: ``node_loss``)."""
    with transaction.atomic():
        if not Node.objects.filter(name=name, epoch=epoch, status=NodeStatus.LOST).update(
            status=NodeStatus.ACTIVE, last_heartbeat=Now()
        ):
            return False
        for workload in Workload.objects.filter(node__name=name, status=S.RUNNING, members__isnull=True):
            last = workload.events.exclude(meter="").order_by("-created_at", "-id").values_list("meter", flat=True)
            if last.first() == MeterChange.PAUSE:
                workload_meter_change(
                    workload, MeterChange.RESUME, f"node {name} is heard again: charged again from now"
                )
    return True


def node_drain(*, node: Node, notice_s: int, by: str = "an operator") -> Node:
    """Place nothing new on the node; its work may finish until ``notice_s`` from now, then is stopped.

    Each running instance's history says when it will be stopped, so its owner can
    save their work (and the instance page says so while the node drains).
    """
    deadline = db_now() + timedelta(seconds=notice_s)
    if not Node.objects.filter(pk=node.pk, status=NodeStatus.ACTIVE).update(
        status=NodeStatus.DRAINING, drain_deadline=deadline
    ):
        node.refresh_from_db()
        raise Conflict(f"node {node.name} is {node.status}; only an active node can be drained")
    notice = (
        f"node {node.name} is being drained by {by} for maintenance: work still running at "
        f"{deadline:%Y-%m-%d %H:%M} UTC is stopped then (jobs are requeued elsewhere)"
    )
    WorkloadEvent.objects.bulk_create(
        WorkloadEvent(workload_id=w.pk, from_status=w.status, to_status=w.status, reason=notice[:255])
        for w in Workload.objects.filter(node=node, status__in=S.holding_resources())
    )
    node.refresh_from_db()
    return node


def node_activate(*, node: Node) -> Node:
    """Take a draining or drained node back into service."""
    if not Node.objects.filter(pk=node.pk, status__in=[NodeStatus.DRAINING, NodeStatus.DRAINED]).update(
        status=NodeStatus.ACTIVE, drain_deadline=None
    ):
        node.refresh_from_db()
        raise Conflict(f"node {node.name} is {node.status}; only a draining or drained node can be activated")
    node.refresh_from_db()
    return node


def nodes_drain_step() -> list[str]:
    """Move draining nodes on: past the deadline their work is stopped; a node with nothing left is drained.

    Returns the names of nodes that became drained. Called by the control plane's reconciliation.
    """
    from scheduler.services.workloads import workload_preempt, workload_stop

    drained = []
    now = db_now()
    for node in Node.objects.filter(status=NodeStatus.DRAINING):
        # Its own work and the gangs with a member there (which stop and are requeued whole).
        holding = Workload.objects.filter(
            Q(node=node) | Q(members__node=node), status__in=S.holding_resources()
        ).distinct()
        if node.drain_deadline and node.drain_deadline <= now:
            reason = f"stopped: node {node.name} was drained for maintenance"
            for workload in holding.filter(status=S.RUNNING):
                if workload.kind == WorkloadKind.JOB:
                    workload_preempt(workload, reason=f"node {node.name} was drained for maintenance")
                else:
                    workload_stop(workload, reason=reason)
        if not holding.exists() and Node.objects.filter(pk=node.pk, status=NodeStatus.DRAINING).update(
            status=NodeStatus.DRAINED
        ):
            drained.append(node.name)
    return drained


def node_remove(*, node: Node, force: bool = False) -> Node:
    """Take a drained or lost node out of the cluster; its agent stops at its next heartbeat.

    Instances whose disk is still on it are refused (move or release them first)
    unless ``force``: then they fail, saying their disk went with the node. Running
    instances of a lost node end at its last heartbeat, the last time they were
    known to run, so they are metered exactly that long.
    """
    node.refresh_from_db()
    if node.status not in (NodeStatus.DRAINED, NodeStatus.LOST):
        raise Conflict(f"node {node.name} is {node.status}: drain it first (or it must be lost)")
    kept = Workload.objects.filter(node=node) | Workload.objects.filter(node__isnull=True, pinned_node=node)
    kept = kept.exclude(status=S.RELEASED)
    if kept.filter(kind=WorkloadKind.INSTANCE).exists() and not force:
        names = ", ".join(str(w.pk) for w in kept.filter(kind=WorkloadKind.INSTANCE)[:10])
        raise Conflict(
            f"instances still keep their disk on node {node.name} (workloads {names}): move or release them "
            "first, or remove it with force (their disks are lost)"
        )
    why = f"node {node.name} was removed from the cluster"
    holding = list(kept.filter(status__in=S.holding_resources()))
    resting = list(kept.exclude(status__in=S.holding_resources()))
    for workload in holding:
        last_seen = max(filter(None, [node.last_heartbeat, workload.status_changed_at]))
        workload_transition(
            workload,
            to=S.FAILED,
            allowed_from=S.holding_resources(),
            reason=f"failed: {why}",
            at=last_seen,
            finished_at=last_seen,
        )
    for workload in resting:
        workload_transition(
            workload,
            to=S.FAILED,
            allowed_from=[S.STOPPED, S.FAILED, S.SUCCEEDED, S.QUEUED],
            reason=f"failed: {why}; its disk went with it",
            node=None,
            pinned_node=None,
        )
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.REMOVED, drain_deadline=None)
    node.refresh_from_db()
    return node
