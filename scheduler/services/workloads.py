"""Writes on workloads: submit, start, stop, restart, release, preempt.

Docker work is never done here: these commit state, then send a task to the
node's queue (``transaction.on_commit``), where the node agent does it.
"""

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from core.errors import Conflict, InvalidInput, TooMany
from core.messages import ToNode, ToScheduler, send, send_after_commit, send_to_nodes
from scheduler.models import (
    WHOLE_CARD,
    Node,
    NodeStatus,
    Workload,
    WorkloadEvent,
    WorkloadGroup,
    WorkloadKind,
    WorkloadMember,
    WorkloadSpec,
    WorkloadStatus,
)
from scheduler.selectors import disk_room, fit_problem
from scheduler.services.allocation import Placement, allocations_create
from scheduler.services.gangs import gang_stop
from scheduler.services.lifecycle import workload_transition
from scheduler.services.node_loss import workload_release_on_lost_node, workload_stop_on_lost_node

log = logging.getLogger(__name__)
S = WorkloadStatus
# Nodes whose launches share one signed message body: a tick's ~200 nodes are four signatures, and a
# message stays ~1.5 KB (each node reads the whole body, so it is not one body for a thousand nodes).
LAUNCH_NODES_PER_BODY = 64


def workload_submit(
    *,
    owner,
    kind: str,
    name: str,
    image_ref: str,
    gpu_model: str,
    gpu_count: int,
    gpu_milli: int,
    cpu_cores: int,
    memory_mb: int,
    disk_gb: int,
    preemptible: bool = False,
    spot: bool = False,
    priority: int = 1,
    max_runtime_s: int | None = None,
    team: str = "",
    command: list | None = None,
    env: dict | None = None,
    pinned_node=None,
    group: WorkloadGroup | None = None,
    nodes: int | None = None,
    elastic_min: int | None = None,
    elastic_max: int | None = None,
) -> Workload:
    """Queue new work. Refuses work that no registered node could ever run.

    ``pinned_node``: the only node it may run on (its image exists only there).
    ``group``: work submitted together; at most its ``max_running`` members run at once.
    ``nodes``: a job (whole cards) may span nodes, a gang: exactly this many with gpu_count / nodes cards
    each, or (None) as many as it takes when no node has them all; ``cpu_cores`` and ``memory_mb`` are per node.
    """
    gang = kind == WorkloadKind.JOB and gpu_milli == WHOLE_CARD and pinned_node is None
    if nodes is not None and nodes > 1 and not gang:
        raise InvalidInput("only batch jobs of whole cards from a registry image may span nodes", field="nodes")
    _check_elastic(gang=gang, gpu_count=gpu_count, nodes=nodes, elastic_min=elastic_min, elastic_max=elastic_max)
    problem = fit_problem(
        gpu_model=gpu_model,
        gpu_count=gpu_count,
        cpu_cores=cpu_cores,
        memory_mb=memory_mb,
        disk_gb=disk_gb,
        nodes=nodes,
        gang=gang,
    )
    if problem:
        raise InvalidInput(problem[1], field=problem[0])
    with transaction.atomic():
        # The owner's row lock serialises their submissions, so the queued-work limit holds under races.
        get_user_model().objects.select_for_update().filter(pk=owner.pk).exists()
        queued = Workload.objects.filter(owner=owner, status=S.QUEUED).count()
        if queued >= settings.MAX_QUEUED_PER_USER:
            raise TooMany(
                f"you already have {queued} instances and jobs waiting in the queue (the limit is "
                f"{settings.MAX_QUEUED_PER_USER}): wait for some to start, or stop some, then try again"
            )
        workload = Workload.objects.create(
            owner=owner,
            kind=kind,
            name=name,
            image_ref=image_ref,
            gpu_model=gpu_model,
            gpu_count=gpu_count,
            gpu_milli=gpu_milli,
            cpu_cores=cpu_cores,
            memory_mb=memory_mb,
            disk_gb=disk_gb,
            preemptible=preemptible or spot,
            spot=spot,
            priority=priority,
            max_runtime_s=max_runtime_s,
            team=team,
            pinned_node=pinned_node,
            group=group,
            nodes=nodes,
            elastic_min=elastic_min,
            elastic_max=elastic_max,
            status=S.QUEUED,
            queued_at=timezone.now(),  # a control-plane time, compared by the control plane only
        )
        WorkloadSpec.objects.create(workload=workload, command=command or [], env=env or {})
        WorkloadEvent.objects.create(workload=workload, from_status="", to_status=S.QUEUED, reason="submitted")
        transaction.on_commit(tick_soon)
    return workload


def _check_elastic(*, gang: bool, gpu_count: int, nodes, elastic_min, elastic_max) -> None:
    """An elastic job (``services.elastic``) gives both sizes, around the size it asks, and may be placed on
    any nodes: a batch job of whole cards from a registry image, with no node count of its own."""
    if elastic_min is None and elastic_max is None:
        return
    if elastic_min is None or elastic_max is None:
        field = "elastic_min" if elastic_min is None else "elastic_max"
        raise InvalidInput("an elastic job gives both elastic_min and elastic_max", field=field)
    if not gang:
        raise InvalidInput("only batch jobs of whole cards from a registry image may be elastic", field="elastic_min")
    if nodes is not None:
        raise InvalidInput("an elastic job's nodes are the scheduler's to choose: leave nodes out", field="nodes")
    if not 1 <= elastic_min <= gpu_count:
        raise InvalidInput(f"elastic_min must be 1 to gpu_count ({gpu_count})", field="elastic_min")
    if elastic_max < gpu_count:
        raise InvalidInput(f"elastic_max must be at least gpu_count ({gpu_count})", field="elastic_max")


def _requeue(workload: Workload, *, node, no_gpu: bool, reason: str) -> None:
    """Stopped or failed work back to queued, on ``node`` (Conflict if it is in another state)."""
    if not workload_transition(
        workload,
        to=S.QUEUED,
        allowed_from=[S.STOPPED, S.FAILED],
        reason=reason,
        pinned_node=node,
        queued_at=Now(),
        exit_code=None,
        no_gpu=no_gpu,
    ):
        raise Conflict(f"cannot start: the {workload.kind} is {workload.status}")


def _home_in_service(node) -> None:
    """Refuse a start on a node that takes no new work (its disk is there)."""
    if node is None:
        return
    node.refresh_from_db(fields=["status"])
    if node.status == NodeStatus.LOST:
        raise Conflict(f"its disk is on node {node.name}, which is unreachable: start it when the node returns")
    if node.status != NodeStatus.ACTIVE:
        raise Conflict(
            f"its disk is on node {node.name}, which is {node.status} and takes no new work: "
            "move it to another host first"
        )


def workload_start(workload: Workload) -> Workload:
    """Queue stopped or failed work again, on the node that keeps its disk."""
    home = workload.disk_node
    if workload.kind == WorkloadKind.INSTANCE:
        _home_in_service(home)
    _requeue(workload, node=home, no_gpu=False, reason="start requested")
    transaction.on_commit(tick_soon)
    return workload


def workload_start_no_gpu(workload: Workload) -> Workload:
    """Start a stopped instance on its node without its cards (CPU only), at once or not at all.

    It needs no card, so it does not wait in the queue: its CPU and memory are taken on
    its node under the same row locks as the tick's placements (the tick never sees it
    queued: this all commits together), or the start is refused saying why.
    """
    if workload.kind != WorkloadKind.INSTANCE:
        raise Conflict("only instances can start without a GPU")
    node = workload.disk_node
    if node is None:
        raise Conflict("its disk is on no node any more: start it normally")
    _home_in_service(node)
    with transaction.atomic():
        _requeue(workload, node=node, no_gpu=True, reason="start without GPU requested")
        placed = allocations_create([Placement(workload, node.pk, [])])
        if not placed:
            raise Conflict(f"node {node.name} has not enough CPU or memory free for it now; try again later")
        launches_send([p.workload for p in placed])
    workload.refresh_from_db()
    return workload


def workload_stop(workload: Workload, *, reason: str = "") -> Workload:
    """Stop running work (its disk and data volume stay); queued work simply leaves the queue."""
    queued_reason = f"stopped while queued: {reason}" if reason else "stopped while queued"
    if workload_transition(workload, to=S.STOPPED, allowed_from=[S.QUEUED], reason=queued_reason):
        return workload
    # Read now, not from the caller's copy (it may have been placed since): one query says both whether it
    # is a gang and whether its node is lost.
    row = Workload.objects.filter(pk=workload.pk).values_list("master_port", "node__status").first()
    master_port, node_status = row or (None, None)
    if master_port is not None:  # ``Workload.is_gang``
        # A gang: every member stops, and it ends stopped once the last one has.
        if not gang_stop(workload, reason=reason or "stopped", requeue=False):
            raise Conflict(f"cannot stop: the {workload.kind} is {workload.status}")
        return workload
    node = workload.node
    if node is not None and node_status == NodeStatus.LOST:
        if workload_stop_on_lost_node(workload, node, reason=reason):
            return workload
    stopping = workload_transition(
        workload, to=S.STOPPING, allowed_from=[S.RUNNING, S.STARTING], reason=reason or "stop requested"
    )
    if not stopping:
        raise Conflict(f"cannot stop: the {workload.kind} is {workload.status}")
    send_after_commit(ToNode.STOP, workload.pk, node=workload.node.name)
    return workload


def workload_restart(workload: Workload) -> Workload:
    """Restart the container of running work in place (same cards, same disk).

    A compare-and-swap like every transition: it claims the work (``restarting``) only if it
    is still running, and not restarting already, at the moment of the write. The claim comes
    before the node stops the container, so that exit is not taken for the work's end by the
    node's exit watcher (which would free the cards the restarted container then runs on);
    the node ends the claim once the container runs again (``agent.actions``).
    """
    claimed = workload_transition(
        workload,
        to=S.RUNNING,
        allowed_from=[S.RUNNING],
        where={"restarting": False},
        reason="restart requested",
        restarting=True,
        restarts=F("restarts") + 1,
    )
    if not claimed:
        workload.refresh_from_db(fields=["status", "restarting"])
        if workload.status == S.RUNNING and workload.restarting:
            raise Conflict(f"the {workload.kind} is restarting already; wait until it runs again")
        raise Conflict(f"cannot restart: the {workload.kind} is {workload.status}")
    send_after_commit(ToNode.RESTART, workload.pk, node=workload.node.name)
    return workload


def workload_release(workload: Workload) -> Workload:
    """Delete the work for good: its container, data volume and disk snapshot."""
    node = workload.disk_node
    releasable = [S.STOPPED, S.FAILED, S.SUCCEEDED, S.QUEUED]
    if node is not None:
        node.refresh_from_db(fields=["status"])
    if node is not None and node.status == NodeStatus.LOST and workload.status in releasable:
        if workload_release_on_lost_node(workload, node):
            return workload
    elif node is None:
        if workload_transition(workload, to=S.RELEASED, allowed_from=releasable, reason="released", finished_at=Now()):
            return workload
    elif workload_transition(workload, to=S.RELEASING, allowed_from=releasable, reason="release requested"):
        send_after_commit(ToNode.RELEASE, workload.pk, node=node.name)
        return workload
    if workload.status in (S.RUNNING, S.STARTING, S.STOPPING):
        raise Conflict(f"cannot release: the {workload.kind} is {workload.status}; stop it first")
    raise Conflict(f"cannot release: the {workload.kind} is {workload.status}")


def launches_send(workloads: list[Workload]) -> None:
    """After commit, tell each node which of these workloads to launch: one message per node.

    The launches of up to ``LAUNCH_NODES_PER_BODY`` nodes share one signed body (``send_to_nodes``:
    the tick's ~200 nodes cost a few signatures, not ~200, and a message stays a few KB); each node
    takes its own part. The messages go out in one Redis pipeline (kombu's publish batch).
    """
    from config.celery import app

    by_node: dict[str, list[int]] = {}
    gangs: dict[int, list[str]] = {}
    gang_ids = [w.pk for w in workloads if w.is_gang]
    for workload_id, node_name in WorkloadMember.objects.filter(workload_id__in=gang_ids).values_list(
        "workload_id", "node_name"
    ):
        gangs.setdefault(workload_id, []).append(node_name)
    for w in workloads:
        for node_name in gangs.get(w.pk, [w.node.name]):  # a gang: each member's node launches its member
            by_node.setdefault(node_name, []).append(w.pk)
    nodes = list(by_node)

    def publish():
        with app.producer_or_acquire() as producer, producer.batch():
            for start in range(0, len(nodes), LAUNCH_NODES_PER_BODY):
                chunk = nodes[start : start + LAUNCH_NODES_PER_BODY]
                send_to_nodes(ToNode.LAUNCH_MANY, {n: by_node[n] for n in chunk}, nodes=chunk, producer=producer)

    transaction.on_commit(publish)


def tick_soon() -> None:
    send(ToScheduler.SCHEDULE_TICK)


def workload_preempt(workload: Workload, *, reason: str) -> bool:
    """Evict running work: SIGTERM, PREEMPTION_GRACE_S to checkpoint, then stop. Call after the tick decided.

    A gang is evicted whole: every member stops, and it is requeued as one. ``workload`` as just read (its
    ``is_gang`` is the row's own: no question to the members' table)."""
    if workload.is_gang:
        return gang_stop(workload, reason=f"preempted: {reason}", requeue=True)
    if not workload_transition(
        workload, to=S.STOPPING, allowed_from=[S.RUNNING], reason=f"preempted: {reason}", preempt_requested=True
    ):
        return False
    send_after_commit(ToNode.STOP, workload.pk, node=workload.node.name)
    return True


def group_create(*, name: str, max_running: int | None, fallback_after: int | None, fallback_at) -> WorkloadGroup:
    """A group the scheduler runs its members under (an array or a sweep): at most ``max_running`` at once; spot
    members fall back to on-demand after ``fallback_after`` preemptions or at ``fallback_at``."""
    return WorkloadGroup.objects.create(
        name=name[:128], max_running=max_running, spot_fallback_after=fallback_after, spot_fallback_at=fallback_at
    )


def group_rename(group: WorkloadGroup, name: str) -> None:
    WorkloadGroup.objects.filter(pk=group.pk).update(name=name[:128])


def disk_growth_check(node: Node, *, more_gb: int, growing_gb: int = 0) -> None:
    """Conflict unless ``node`` has room for ``more_gb`` more of tenants' disks (a data disk growing there), beside
    the ``growing_gb`` that growths already under way there will take. Call in a transaction: the node's row stays
    locked until it ends, so growths on one host are checked one after the other."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    room = disk_room(node)
    if room is not None and room - growing_gb < more_gb:
        left = max(room - growing_gb, 0)
        raise Conflict(f"its host {node.name} has {left} GB left for tenants' disks: it cannot grow by {more_gb} GB")


def workload_disk_set(workload_id: int, disk_gb: int) -> None:
    """The size its data disk has now (its node grew it, or it has never run): storage is charged on it."""
    Workload.objects.filter(pk=workload_id).update(disk_gb=disk_gb)
