"""Node registration, heartbeats, and marking silent nodes lost.

Control-plane code: it takes what a node agent reports (``GpuInfo``) and never
imports the GPU-host side (``scheduler.node``).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from scheduler.models import Gpu, Node, NodeStatus, Workload, WorkloadKind, WorkloadStatus
from scheduler.services.lifecycle import workload_transition

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
    cpu_cores: int,
    memory_mb: int,
    gpus: list[GpuInfo],
    simulated: bool,
    nvidia_runtime: bool,
    docker_version: str = "",
) -> Node:
    """Create or refresh a node and its cards; the node is active from now on, under a new epoch.

    Call after the agent has fenced the host (``agent_reconcile``): nothing may run
    there that the database does not assign to it.
    """
    with transaction.atomic():
        node, _ = Node.objects.select_for_update().update_or_create(
            name=name,
            defaults=dict(
                hostname=hostname,
                address=address,
                relay_url=relay_url,
                cpu_cores=cpu_cores,
                memory_mb=memory_mb,
                simulated=simulated,
                nvidia_runtime=nvidia_runtime,
                docker_version=docker_version,
                status=NodeStatus.ACTIVE,
                last_heartbeat=timezone.now(),
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


def node_heartbeat(*, name: str, epoch: int) -> str | None:
    """Record that the node's agent (of this epoch) is alive; returns the node's status.

    None: a newer agent registered this node, so this one must stop. A lost node
    stays lost here: it rejoins through ``node_rejoin`` once it has fenced itself.
    """
    updated = Node.objects.filter(name=name, epoch=epoch).update(last_heartbeat=timezone.now())
    if not updated:
        return None
    return Node.objects.filter(name=name).values_list("status", flat=True).first()


def node_rejoin(*, name: str, epoch: int) -> bool:
    """A lost node whose agent has stopped every container not assigned to it is active again."""
    return bool(
        Node.objects.filter(name=name, epoch=epoch, status=NodeStatus.LOST).update(
            status=NodeStatus.ACTIVE, last_heartbeat=timezone.now()
        )
    )


def nodes_mark_lost(*, silent_for: timedelta, now=None) -> list[str]:
    """Mark nodes whose agent has been silent too long as lost, and settle their work.

    Jobs are requeued to run anywhere (they resume from a checkpoint their command
    can reach); instances, whose disk lives on that node, fail with a reason that says
    so and can be started again when it returns, or released; a release under way
    completes (the node removes the leftovers when it returns).
    """
    now = now or timezone.now()
    lost = []
    for node in Node.objects.filter(status=NodeStatus.ACTIVE, last_heartbeat__lt=now - silent_for):
        if not Node.objects.filter(pk=node.pk, status=NodeStatus.ACTIVE).update(status=NodeStatus.LOST):
            continue
        lost.append(node.name)
        why = f"node {node.name} stopped sending heartbeats"
        for workload in Workload.objects.filter(node=node, status__in=S.holding_resources()):
            if workload.kind == WorkloadKind.JOB:
                workload_transition(
                    workload,
                    to=S.QUEUED,
                    allowed_from=S.holding_resources(),
                    reason=f"requeued: {why}",
                    queued_at=now,
                    node=None,
                    pinned_node=None,
                    preempt_requested=False,
                    preemptions=workload.preemptions + 1,
                )
            else:
                workload_transition(
                    workload,
                    to=S.FAILED,
                    allowed_from=S.holding_resources(),
                    reason=f"node lost: {why}; start it again when the node returns, or release it",
                    finished_at=now,
                )
        for workload in Workload.objects.filter(Q(node=node) | Q(pinned_node=node), status=S.RELEASING):
            workload_release_on_lost_node(workload, node)
    return lost


def workload_release_on_lost_node(workload: Workload, node: Node) -> bool:
    """Release work whose node is gone: done now; the node removes its container and disk when it returns."""
    return workload_transition(
        workload,
        to=S.RELEASED,
        allowed_from=[S.RELEASING, S.STOPPED, S.FAILED, S.SUCCEEDED, S.QUEUED],
        reason=f"released; its container and disk are removed from node {node.name} when it returns",
        finished_at=timezone.now(),
    )
