"""Node registration, heartbeats, and marking silent nodes lost."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from scheduler.models import Gpu, Node, NodeStatus, Workload, WorkloadStatus
from scheduler.node.gpus import GpuInfo
from scheduler.services.lifecycle import workload_transition


def node_register(
    *,
    name: str,
    hostname: str,
    cpu_cores: int,
    memory_mb: int,
    gpus: list[GpuInfo],
    simulated: bool,
    nvidia_runtime: bool,
    docker_version: str = "",
) -> Node:
    """Create or refresh a node and its cards; the node is active from now on."""
    with transaction.atomic():
        node, _ = Node.objects.select_for_update().update_or_create(
            name=name,
            defaults=dict(
                hostname=hostname,
                cpu_cores=cpu_cores,
                memory_mb=memory_mb,
                simulated=simulated,
                nvidia_runtime=nvidia_runtime,
                docker_version=docker_version,
                status=NodeStatus.ACTIVE,
                last_heartbeat=timezone.now(),
            ),
        )
        seen = []
        for gpu in gpus:
            card, _ = Gpu.objects.update_or_create(
                uuid=gpu.uuid, defaults=dict(node=node, index=gpu.index, model=gpu.model, memory_mb=gpu.memory_mb)
            )
            seen.append(card.pk)
        # Cards that vanished from the host go, unless work still holds them.
        node.gpus.exclude(pk__in=seen).filter(allocations__isnull=True).delete()
    return node


def node_heartbeat(*, name: str) -> bool:
    """Record that the node's agent is alive; a lost node that speaks again is active."""
    now = timezone.now()
    updated = (
        Node.objects.filter(name=name)
        .exclude(status=NodeStatus.DRAINED)
        .update(last_heartbeat=now, status=NodeStatus.ACTIVE)
    )
    return bool(updated)


def nodes_mark_lost(*, silent_for: timedelta, now=None) -> list[str]:
    """Mark nodes whose agent has been silent too long as lost, and fail their work."""
    now = now or timezone.now()
    lost = []
    for node in Node.objects.filter(status=NodeStatus.ACTIVE, last_heartbeat__lt=now - silent_for):
        if not Node.objects.filter(pk=node.pk, status=NodeStatus.ACTIVE).update(status=NodeStatus.LOST):
            continue
        lost.append(node.name)
        for workload in Workload.objects.filter(node=node, status__in=WorkloadStatus.holding_resources()):
            workload_transition(
                workload,
                to=WorkloadStatus.FAILED,
                allowed_from=WorkloadStatus.holding_resources(),
                reason=f"lost: node {node.name} stopped sending heartbeats",
                finished_at=now,
            )
    return lost
