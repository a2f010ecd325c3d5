"""Moving a stopped instance to another host: its system disk and data disk copied through the agents.

AutoDL's answer to "the machine holding my instance has no free card": the
instance's disks live on one host (Docker volumes are per host), so to run
elsewhere they are copied there while it is stopped.

1. ``workload_move`` (a user or an operator): the instance goes ``stopped ->
   moving`` and a ``Move`` row records source, target and progress; the source
   agent gets ``ToNode.MOVE_EXPORT``.
2. The source commits the container's filesystem (the system disk) and pushes
   it to the registry as a snapshot, then reports (``move_report``).
3. The target gets ``ToNode.MOVE_IMPORT``: it pulls the snapshot, makes the data
   disk (its size, on its own engine) and fetches its contents from the source
   agent's relay as a tar stream, reporting progress; both ends count the bytes
   and hash them.
4. When both reports agree (bytes and SHA-256), the instance is ``stopped`` on
   the target, pinned there and started from the snapshot; the source's copy
   (container, disk, local snapshot) is removed and the registry's copy deleted.
   Anything else fails the move: the instance is ``stopped`` on the source as it
   was, and the target removes what it made.

A move that reports no progress for ``MOVE_STALL_S`` fails the same way
(``moves_stalled_fail``, from the control plane's reconciliation).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.db.models.functions import Now

from core.clock import db_now
from core.errors import Conflict, InvalidInput
from core.messages import ToNode, send_after_commit
from core.relay import VOLUME_TICKET_S, Op, Ticket, ticket_sign
from scheduler import registry
from scheduler.models import Move, MoveStatus, Node, NodeStatus, Workload, WorkloadKind, WorkloadStatus
from scheduler.selectors import disk_reserved_gb, disk_room
from scheduler.services.lifecycle import workload_transition

log = logging.getLogger(__name__)
S = WorkloadStatus
# Hosts whose agent can still copy a disk out: it answers, whatever it may run.
REACHABLE = [NodeStatus.ACTIVE, NodeStatus.DRAINING, NodeStatus.DRAINED]


def move_target_choose(workload: Workload, source: Node) -> Node | None:
    """The active host with the instance's GPU type, enough cards and room for its disks that has the most cards
    free."""
    hosts = (
        Node.objects.filter(status=NodeStatus.ACTIVE, gpus__model=workload.gpu_model)
        .exclude(pk=source.pk)
        .annotate(
            cards=Count("gpus", filter=Q(gpus__model=workload.gpu_model)),
            free=Count("gpus", filter=Q(gpus__model=workload.gpu_model, gpus__allocated_milli=0)),
        )
        .filter(cards__gte=workload.gpu_count)
        .order_by("-free", "name")
    )
    need = disk_reserved_gb(workload.disk_gb)
    return next((host for host in hosts if (room := disk_room(host)) is None or room >= need), None)


def workload_move(workload: Workload, *, target: Node | None = None) -> Move:
    """Start moving a stopped instance's disks to ``target`` (default: chosen); Conflict if it cannot be now."""
    if workload.kind != WorkloadKind.INSTANCE:
        raise Conflict("only instances are moved (a job resumes anywhere from its checkpoint)")
    if not settings.REGISTRY:
        raise Conflict("moving needs the platform's image registry (REGISTRY): the system disk travels through it")
    source = workload.disk_node
    if source is None:
        raise Conflict("it has no disk on any host yet: start it, it runs wherever there is room")
    source.refresh_from_db()
    if source.status not in REACHABLE:
        raise Conflict(f"its host {source.name} is {source.status}: its disk cannot be copied from there now")
    target = target or move_target_choose(workload, source)
    if target is None:
        raise Conflict(f"no other active host has {workload.gpu_count} × {workload.gpu_model}")
    if target.pk == source.pk:
        raise InvalidInput("that is the host it is on", field="node")
    if target.status != NodeStatus.ACTIVE or not target.gpus.filter(model=workload.gpu_model).exists():
        raise InvalidInput(f"{target.name} is not an active host with {workload.gpu_model} cards", field="node")
    with transaction.atomic():
        if not workload_transition(
            workload,
            to=S.MOVING,
            allowed_from=[S.STOPPED, S.FAILED],
            reason=f"moving its disks from {source.name} to {target.name}",
        ):
            raise Conflict(f"only a stopped instance is moved; it is {workload.status}")
        _disk_room_check(workload, Node.objects.select_for_update().get(pk=target.pk))
        move = Move.objects.create(workload=workload, source=source, target=target, phase="saving the system disk")
        send_after_commit(ToNode.MOVE_EXPORT, move.pk, node=source.name)
    return move


def _disk_room_check(workload: Workload, target: Node) -> None:
    """Conflict unless ``target`` (locked) has room for the instance's disks: the copy reserves them there."""
    room, need = disk_room(target), disk_reserved_gb(workload.disk_gb)
    if room is not None and room < need:
        raise Conflict(
            f"{target.name} has {max(room, 0)} GB left for tenants' disks; this instance's need {need} GB "
            f"(its {workload.disk_gb} GB data disk and its system disk)"
        )


MOVE_REPOSITORY = "gpucloud-move"  # every move's snapshot has a repository of its own under it


def move_snapshot_repository(move_id: int) -> str:
    """The repository of move ``move_id``'s snapshot: its own, so the token server can let the source push there
    alone and the target pull from there alone (``portal.services.registry_tokens``)."""
    return f"{MOVE_REPOSITORY}/m{move_id}"


def move_snapshot_ref(move: Move) -> str:
    """Where the source pushes the system disk of ``move``: the one snapshot the move may name."""
    repository = move_snapshot_repository(move.pk)
    return registry.registry_ref(f"{repository}:{settings.DEPLOYMENT_ID}-{move.workload.uid}-{move.pk}")


def move_report(move_id: int, report: dict, *, host: str | None = None) -> None:
    """An agent's report on a move: progress, what it sent or received, or an error; the next step follows.

    ``report`` keys: ``phase``, ``snapshot_ref``, ``bytes_total``, ``bytes_done``, ``sent_sha256`` +
    ``bytes_sent`` (the source's relay), ``received_sha256`` + ``bytes_received`` (the target), ``error``.
    ``host``: the host that signed it (``core.signing.sent_by``; None: the control plane): taken only from the
    move's source with the source's keys, from its target with the target's.
    """
    with transaction.atomic():
        move = Move.objects.select_for_update().select_related("workload", "source", "target").get(pk=move_id)
        if move.status != MoveStatus.COPYING:
            return  # late news of a move already settled
        if host is not None and not _reported_by(move, report, host):
            log.warning("refused a report on move %s from host %s: %s", move.pk, host, sorted(report))
            return
        if report.get("error"):
            _move_fail(move, str(report["error"]))
            return
        # Any host can send a report: a snapshot named otherwise (another user's saved image, another
        # registry) would become the instance's system disk, and be deleted from the registry after.
        if report.get("snapshot_ref") is not None and report["snapshot_ref"] != move_snapshot_ref(move):
            _move_fail(move, f"the system disk was reported at {str(report['snapshot_ref'])[:100]!r}, not the move's")
            return
        for field in ("phase", "snapshot_ref", "bytes_total", "bytes_done", "sent_sha256", "received_sha256"):
            if report.get(field) is not None:
                setattr(move, field, report[field])
        for counted in ("bytes_sent", "bytes_received"):
            if counted in report:
                move.bytes_done = max(move.bytes_done, int(report[counted]))
        move.updated_at = Now()
        move.save()
        if report.get("nothing_to_copy"):
            _move_finish(move)
            return
        if report.get("exported"):
            send_after_commit(ToNode.MOVE_IMPORT, move.pk, _volume_capability(move), node=move.target.name)
        if move.sent_sha256 and move.received_sha256:
            if move.sent_sha256 == move.received_sha256:
                _move_finish(move)
            else:
                _move_fail(move, "the data disk arrived different from what was sent (checksums differ)")


SOURCE_SAYS = {"snapshot_ref", "exported", "nothing_to_copy", "sent_sha256", "bytes_sent"}
TARGET_SAYS = {"received_sha256", "bytes_received"}
EITHER_SAYS = {"phase", "bytes_total", "bytes_done", "error"}


def _reported_by(move: Move, report: dict, host: str) -> bool:
    """Whether ``host`` may say what ``report`` says of ``move``: the source its side, the target its own."""
    says = set(report)
    if host == move.source.name:
        return says <= SOURCE_SAYS | EITHER_SAYS
    if host == move.target.name:
        return says <= TARGET_SAYS | EITHER_SAYS
    return False


def _volume_capability(move: Move) -> str:
    """What lets the target read the source's data disk for this one move, once, from its own address: a VOLUME
    ticket the control plane signs (a host cannot make one). It is good until the move would be failed for want
    of news."""
    workload = move.workload
    ticket = Ticket(
        op=Op.VOLUME,
        container=workload.container_name,
        workload=workload.pk,
        user=workload.owner_id,
        move=move.pk,
        peer=move.target.address,  # taken only from the target (read from the queue by another host: refused)
    )
    return ticket_sign(ticket, ttl=VOLUME_TICKET_S)


def _move_finish(move: Move) -> None:
    workload = move.workload
    fields = {"node": None, "pinned_node": move.target}
    if move.snapshot_ref:
        fields["image_ref"] = move.snapshot_ref  # its system disk, now on the target
    if not workload_transition(
        workload,
        to=S.STOPPED,
        allowed_from=[S.MOVING],
        reason=f"moved from {move.source.name} to {move.target.name}",
        **fields,
    ):
        return
    Move.objects.filter(pk=move.pk).update(status=MoveStatus.DONE, phase="done", updated_at=Now())
    send_after_commit(ToNode.MOVE_CLEANUP, move.pk, "source", node=move.source.name)
    _snapshot_forget_after_commit(move.snapshot_ref)


def _move_fail(move: Move, why: str) -> None:
    log.warning("move %s of workload %s failed: %s", move.pk, move.workload_id, why)
    Move.objects.filter(pk=move.pk).update(status=MoveStatus.FAILED, error=why[:255], updated_at=Now())
    workload_transition(
        move.workload,
        to=S.STOPPED,
        allowed_from=[S.MOVING],
        reason=f"moving to {move.target.name} failed: {why}; it stays on {move.source.name}"[:255],
    )
    send_after_commit(ToNode.MOVE_CLEANUP, move.pk, "target", node=move.target.name)
    _snapshot_forget_after_commit(move.snapshot_ref)


def _snapshot_forget_after_commit(ref: str) -> None:
    """The registry's copy of the system disk is only for the journey: the target keeps it on its engine."""
    if not ref:
        return

    def forget():
        try:
            registry.manifest_delete(registry.image_name(ref))
        except registry.RegistryError as exc:  # left in the registry; `registry.sh gc` does not free it
            log.warning("could not delete the move snapshot %s from the registry: %s", ref, exc.message)

    transaction.on_commit(forget)


def moves_stalled_fail() -> list[int]:
    """Fail moves that reported nothing for ``MOVE_STALL_S`` (an agent died, a host went away)."""
    cutoff = db_now() - timedelta(seconds=settings.MOVE_STALL_S)
    failed = []
    for move_id in Move.objects.filter(status=MoveStatus.COPYING, updated_at__lt=cutoff).values_list("pk", flat=True):
        move_report(move_id, {"error": f"no progress for {settings.MOVE_STALL_S} s"})
        failed.append(move_id)
    return failed
