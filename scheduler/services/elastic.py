"""Resizing elastic jobs as the tick decided: members joining or leaving a gang that runs on, or a restart from
checkpoint at the new size.

**In place** (``resize_in_place``): an elastic gang (every elastic job where checkpoints are shared: a gang of
one member at least, ``allocation.Placement.gang``) whose new size keeps each of its members' cards as they are,
rank 0's included, and only adds members on other nodes or drops whole members. Its members run torchrun on
the job's c10d rendezvous (``agent.launcher.elastic_env``): a member that joins is launched while the gang runs
(its cards taken now, billed from now: a new meter segment at the new size); a member that leaves is sent
SIGTERM with ``PREEMPTION_GRACE_S`` to checkpoint, and once its container ended its cards are given back and
billed no longer (``gangs.members_left_release``). The other members' torchrun restart their processes in the new
world each time, which resume from the job's checkpoint; nothing is queued again. One change at a time: a gang
with a member still joining or leaving is not resized.

**A restart** otherwise:

An elastic job (``Workload.elastic_min``..``elastic_max`` cards) is resized the way a batch job is
preempted, on the same path: SIGTERM and ``PREEMPTION_GRACE_S`` to checkpoint, then its node stops it
and queues it again (on that node, where its checkpoint volume is; a gang anywhere, its checkpoint
being on the shared storage), and the next tick places it at the size decided here (``gpu_count``),
or at its minimum if that size no longer fits. Its launch sets ``WORLD_SIZE``/``NPROC_PER_NODE`` for
its new cards, and its command resumes from the checkpoint.

Billing follows the cards held second by second: each size is its own run, and each run's meter
segment records the cards it holds (``billing.metering.meter_open``); between the stop and the
relaunch nothing is metered, as for a preemption.
"""

from django.db import transaction
from django.db.models.functions import Now

from core.messages import ToNode, send_after_commit
from scheduler.models import Allocation, MemberStatus, MeterChange, Workload, WorkloadMember, WorkloadStatus
from scheduler.services.allocation import Part, members_join
from scheduler.services.gangs import gang_stop
from scheduler.services.lifecycle import workload_meter_change, workload_transition

S = WorkloadStatus
M = MemberStatus
BUSY = "busy"  # a member still joins or leaves: no other change now
UNCHANGED = "unchanged"  # the members already hold what the tick decided (it decided on a view of a moment ago)


def workload_resize(workload: Workload, *, gpu_count: int, reason: str, parts: list[Part] | None = None) -> bool:
    """Resize running elastic work to ``gpu_count`` cards, at ``parts`` (each node's cards, rank 0's first, as
    the tick decided): in place where it can, else a restart (see the module). Returns False, changing nothing,
    when it is not running (it stopped or is being stopped meanwhile), a member still joins or leaves, the
    size is outside its range, the cards to join with were taken meanwhile, or its members hold ``parts``
    already: the tick decides on what it read at its start, and a member that was leaving may have left since
    (its cards given back, the size the tick wanted reached), which is no reason to restart it."""
    if workload.elastic_min is None or not workload.elastic_min <= gpu_count <= workload.elastic_max:
        return False
    if parts is not None and workload.is_gang and workload.status == S.RUNNING:
        change = membership_change(workload, parts)
        if change in (BUSY, UNCHANGED):
            return False
        if change is not None:
            return resize_in_place(workload, *change, reason=reason)
    why = f"resizing: {reason}; restarts from its checkpoint"
    if workload.is_gang:
        if workload.status != S.RUNNING or not gang_stop(workload, reason=why, requeue=True):
            return False
        Workload.objects.filter(pk=workload.pk, status=S.STOPPING).update(gpu_count=gpu_count)
        workload.gpu_count = gpu_count
        return True
    if not workload_transition(
        workload, to=S.STOPPING, allowed_from=[S.RUNNING], reason=why, preempt_requested=True, gpu_count=gpu_count
    ):
        return False
    send_after_commit(ToNode.STOP, workload.pk, node=workload.node.name)
    return True


def membership_change(workload: Workload, parts: list[Part]):
    """(parts that join, members that leave) when going to ``parts`` keeps every remaining member's cards, rank
    0's among them; None when it does not (a restart), ``BUSY`` while a member joins or leaves, ``UNCHANGED``
    when the live members hold just ``parts`` already."""
    members = list(WorkloadMember.objects.filter(workload=workload, status__in=M.live()).order_by("rank"))
    if not members or any(m.status != M.RUNNING for m in members):
        return BUSY if members else None
    held: dict[int, set[int]] = {}
    for node_id, gpu_id in Allocation.objects.filter(workload=workload).values_list("gpu__node_id", "gpu_id"):
        held.setdefault(node_id, set()).add(gpu_id)
    wanted = {part.node_id: {s.gpu_id for s in part.shares} for part in parts}
    if members[0].node_id not in wanted:
        return None  # rank 0 hosts the rendezvous: it never leaves a running gang
    for member in members:
        if member.node_id in wanted and wanted[member.node_id] != held.get(member.node_id, set()):
            return None  # a member's own cards change: torchrun cannot change a member's processes in place
    joins = [part for part in parts if part.node_id not in held]
    leaves = [m for m in members if m.node_id not in wanted]
    return (joins, leaves) if joins or leaves else UNCHANGED


def resize_in_place(workload: Workload, joins: list[Part], leaves: list[WorkloadMember], *, reason: str) -> bool:
    """Members join on ``joins`` and ``leaves`` leave, the gang running on (see the module)."""
    with transaction.atomic():
        locked = Workload.objects.select_for_update().filter(pk=workload.pk, status=S.RUNNING).first()
        if locked is None:
            return False
        joined = members_join(locked, joins) if joins else []
        if joins and not joined:
            return False  # its new cards were taken meanwhile
        left = [
            m
            for m in leaves
            if WorkloadMember.objects.filter(pk=m.pk, status=M.RUNNING).update(
                status=M.LEAVING, reason=f"leaving: {reason}"[:255], changed_at=Now()
            )
        ]
        if not (joined or left):
            return False
        Workload.objects.filter(pk=locked.pk).update(resized_at=Now())  # the next resize waits its interval
        if joined:
            names = ", ".join(f"rank {m.rank} joins on {m.node_name}" for m in joined)
            workload_meter_change(locked, MeterChange.RESIZE, f"{reason}: {names}")
        for member in joined:
            send_after_commit(ToNode.LAUNCH, locked.pk, member.node_name, node=member.node_name)
        for member in left:
            send_after_commit(ToNode.STOP, locked.pk, member.node_name, node=member.node_name)
        workload.gpu_count = locked.gpu_count
        return True
