"""Gangs: one job placed on several nodes, run as one container per node, started, stopped and requeued as one.

The gang is one ``Workload`` (its status is the gang's: one row for its owner, one
bill with all its cards); each node's part is a ``WorkloadMember`` written with
the placement (``allocation.py``). A node agent writes only its own member's row
(its container running, exited or stopped: ``member_*`` here, compare-and-swap),
then asks the control plane to step the gang (``ToScheduler.GANG_STEP``); the
control plane's reconciliation beat steps every gang too, so a lost message only
delays a step. ``gang_step`` decides, under the workload's row lock, from all the
members:

- starting, every member running: the gang runs;
- running, every member exited with code 0: it succeeds;
- a member failed (exited with another code, failed to start, its container gone)
  or was stopped (its host lost): the whole gang stops (``gang_stop``) — every
  live member's node sends its container SIGTERM and waits the grace period to
  checkpoint — and it is requeued as one, unless it has been restarted
  ``GANG_MAX_RESTARTS`` times already (then it fails);
- stopping, no member live any more: it settles — queued again as one (preempted,
  a host lost, a member failed), failed, or stopped (its owner's stop).

A requeued gang may land on other nodes: it resumes from its checkpoint on the
shared file storage, which every host mounts (``agent/launcher.py``).
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.db.models.functions import Now

from core.clock import db_now
from core.messages import ToNode, ToScheduler, send, send_after_commit
from scheduler.models import Allocation, MemberStatus, MeterChange, Workload, WorkloadMember, WorkloadStatus
from scheduler.services.lifecycle import allocations_free, workload_meter_change, workload_transition

S = WorkloadStatus
M = MemberStatus
LIVE = M.live()
GONE = [M.LEAVING, M.LEFT]  # an elastic gang's members leaving or gone while it runs on: not the gang's end
# Members whose end is a leaving, not the gang's: told to leave, or joining a running gang (never started).
LEAVES = Q(status=M.LEAVING) | Q(status=M.STARTING, workload__status=S.RUNNING)
FAILED_PREFIX = "failed: "  # a stopping gang whose reason says so ends failed, not stopped


def gang_members(workload: Workload) -> list[WorkloadMember]:
    """Its members, rank 0 first, with their nodes ([] for single-node work)."""
    return list(WorkloadMember.objects.filter(workload_id=workload.pk).select_related("node").order_by("rank"))


def gang_member_on(workload: Workload, node_name: str) -> WorkloadMember | None:
    return WorkloadMember.objects.filter(workload_id=workload.pk, node_name=node_name).select_related("node").first()


# --- a node agent's writes: its own member's row, then a step of the gang --------------------------------


def member_address(member: WorkloadMember, address: str) -> bool:
    """Its fixed address on its host's tenants' network, chosen before its container starts (fenced hosts:
    ``agent.gangs``). False when the member left starting meanwhile."""
    return _member_moved(member, [M.STARTING], address=address)


def member_running(member: WorkloadMember, *, container_id: str, address: str) -> bool:
    """Its container runs. False when the member was stopped meanwhile: the caller stops the container."""
    return _member_moved(
        member, [M.STARTING], status=M.RUNNING, container_id=container_id, address=address, reason="container running"
    )


def member_exited(member: WorkloadMember, *, exit_code: int | None, reason: str) -> bool:
    """Its container ended by itself (or never started: ``exit_code`` None); a leaving member's has left."""
    return _member_ended(member, M.EXITED, exit_code=exit_code, reason=reason)


def member_stopped(member: WorkloadMember, *, exit_code: int | None, reason: str = "stopped") -> bool:
    """Its container was stopped by the platform (the gang stops as one, or this member leaves it)."""
    return _member_ended(member, M.STOPPED, exit_code=exit_code, reason=reason)


def _member_ended(member: WorkloadMember, status: str, *, exit_code: int | None, reason: str) -> bool:
    """A leaving member's container ended, whichever way: it left (``gang_step`` gives its cards back), and so
    did a member joining a running gang that ended before it ran (it never started: the gang runs on without
    it); any other live member's ended as ``status``."""
    fields = dict(exit_code=exit_code, reason=reason[:255])
    if WorkloadMember.objects.filter(LEAVES, pk=member.pk).update(status=M.LEFT, changed_at=Now(), **fields):
        _step_soon(member.workload_id)
        return True
    return _member_moved(member, [M.STARTING, M.RUNNING], status=status, **fields)


def _member_moved(member: WorkloadMember, allowed_from: list, **fields) -> bool:
    """Compare-and-swap of the member's row from ``allowed_from``, then a step of its gang."""
    updated = WorkloadMember.objects.filter(pk=member.pk, status__in=allowed_from).update(changed_at=Now(), **fields)
    _step_soon(member.workload_id)
    return bool(updated)


def _step_soon(workload_id: int) -> None:
    send_after_commit(ToScheduler.GANG_STEP, workload_id, robust=True)


# --- the control plane's decisions -----------------------------------------------------------------------


def gang_step(workload_id: int) -> str | None:
    """Move the gang on from its members' states; returns the status it moved to (None: nothing to do)."""
    with transaction.atomic():
        workload = Workload.objects.select_for_update().filter(pk=workload_id).first()
        members = list(WorkloadMember.objects.filter(workload_id=workload_id).order_by("rank"))
        if workload is None or not members:
            return None
        if workload.status == S.STOPPING:
            return _settle(workload, members)
        if workload.status not in (S.STARTING, S.RUNNING):
            return None
        if workload.status == S.RUNNING:
            members_left_release(workload, members)
        gone = [m for m in members if m.status in GONE]
        members = [m for m in members if m.status not in GONE]
        failed = next((m for m in members if m.status == M.STOPPED or (m.status == M.EXITED and m.exit_code)), None)
        failed = failed or next((m for m in members if m.status == M.EXITED and m.exit_code is None), None)
        if failed is None and workload.status == S.RUNNING and any(m.status == M.EXITED for m in members):
            if all(m.status == M.EXITED for m in members) and not any(m.status == M.LEAVING for m in gone):
                workload_transition(
                    workload,
                    to=S.SUCCEEDED,
                    allowed_from=[S.RUNNING],
                    reason="finished: every member exited with code 0",
                    exit_code=0,
                    finished_at=Now(),
                )
                return S.SUCCEEDED
            return None  # the others are still at work
        if failed is not None:
            what = f"member rank {failed.rank} on {failed.node_name}: {failed.reason or failed.status}"
            if workload.preemptions < settings.GANG_MAX_RESTARTS:
                gang_stop(workload, reason=f"{what}; the gang stops and resumes from its checkpoint", requeue=True)
            else:
                gang_stop(
                    workload,
                    reason=f"{FAILED_PREFIX}{what} (restarted {workload.preemptions} times already)",
                    requeue=False,
                )
            return S.STOPPING
        if workload.status == S.STARTING and all(m.status == M.RUNNING for m in members):
            workload_transition(
                workload,
                to=S.RUNNING,
                allowed_from=[S.STARTING],
                reason=f"all {len(members)} members running",
                container_id=members[0].container_id,
                started_at=Now(),
            )
            return S.RUNNING
    return None


def members_left_release(workload: Workload, members: list[WorkloadMember]) -> int:
    """Give back the cards of an elastic gang's members that left while it runs on (call holding the workload's
    row lock): their shares, CPU and memory, its size, and a new meter segment at that size. Returns the
    cards given back (0: none held by a member that left)."""
    left = [m for m in members if m.status == M.LEFT and m.node_id is not None]
    if not left:
        return 0
    held = dict(
        Allocation.objects.filter(workload_id=workload.pk, gpu__node_id__in=[m.node_id for m in left])
        .values_list("gpu__node_id")
        .annotate(n=Count("id"))
        .values_list("gpu__node_id", "n")
    )
    given = 0
    for member in left:
        if held.get(member.node_id):
            allocations_free(workload.pk, member_node_id=member.node_id)
            given += held[member.node_id]
    if given:
        old = workload.gpu_count
        workload.gpu_count = old - given
        Workload.objects.filter(pk=workload.pk).update(gpu_count=workload.gpu_count)
        names = ", ".join(f"rank {m.rank} on {m.node_name}" for m in left if held.get(m.node_id))
        workload_meter_change(
            workload, MeterChange.RESIZE, f"shrunk from {old} to {workload.gpu_count} cards: {names} left"
        )
    return given


def gang_tell(workload_id: int) -> None:
    """After a member moved (``ToScheduler.GANG_STEP``): every member's node rewrites the gangs' way through
    its fence (a fellow's address came or went), and once rank 0 has its address the members that wait for
    it are sent their launch (each starts knowing ``MASTER_ADDR``). The reconciliation beat does both more
    slowly (``launches_resend``, a node's reconcile): a lost message only delays them."""
    workload = Workload.objects.filter(pk=workload_id).only("status").first()
    members = list(WorkloadMember.objects.filter(workload_id=workload_id).order_by("rank"))
    if workload is None or not members:
        return
    for member in members:
        send(ToNode.GANG_FENCE, node=member.node_name)
    if workload.status == S.STARTING and members[0].address:
        for member in members[1:]:
            if member.status == M.STARTING and not member.address:
                send(ToNode.LAUNCH, workload_id, member.node_name, node=member.node_name)


def gang_stop(workload: Workload, *, reason: str, requeue: bool) -> bool:
    """Stop every live member (SIGTERM, then the grace period): the gang is stopping until its last member
    is stopped, then queued again (``requeue``), failed (a reason starting "failed: ") or stopped.
    Returns False when the gang was neither starting nor running."""
    if not workload_transition(
        workload, to=S.STOPPING, allowed_from=[S.RUNNING, S.STARTING], reason=reason, preempt_requested=requeue
    ):
        return False
    live = list(WorkloadMember.objects.filter(workload_id=workload.pk, status__in=LIVE))
    for member in live:
        send_after_commit(ToNode.STOP, workload.pk, member.node_name, node=member.node_name)
    if not live:
        _step_soon(workload.pk)  # nothing to wait for (every host lost): settle now
    return True


def _settle(workload: Workload, members: list[WorkloadMember]) -> str | None:
    """A stopping gang with no live member: queued again as one, failed or stopped."""
    if any(m.status in LIVE for m in members):
        return None
    common = dict(preempt_requested=False)
    if workload.preempt_requested:
        workload_transition(
            workload,
            to=S.QUEUED,
            allowed_from=[S.STOPPING],
            reason=f"requeued as one ({workload.status_reason})",
            queued_at=Now(),
            node=None,
            pinned_node=None,  # its checkpoint is on the shared storage: any nodes will do
            preemptions=workload.preemptions + 1,
            **common,
        )
        return S.QUEUED
    failed = workload.status_reason.startswith(FAILED_PREFIX)
    workload_transition(
        workload,
        to=S.FAILED if failed else S.STOPPED,
        allowed_from=[S.STOPPING],
        reason=workload.status_reason if failed or workload.status_reason.startswith("stopped") else "stopped",
        finished_at=Now(),
        **common,
    )
    return S.FAILED if failed else S.STOPPED


def gangs_of_lost_node(node, *, why: str) -> list[int]:
    """A lost host's live members are stopped (its agent fenced them); each of their gangs stops and is
    requeued as one."""
    requeued = []
    for member in WorkloadMember.objects.filter(node=node, status__in=LIVE).select_related("workload"):
        if WorkloadMember.objects.filter(LEAVES, pk=member.pk).update(
            status=M.LEFT, reason=f"left; its host is lost ({why})"[:255], changed_at=Now()
        ):
            _step_soon(member.workload_id)  # it was leaving (or joining) anyway: the gang runs on
            continue
        WorkloadMember.objects.filter(pk=member.pk, status__in=LIVE).update(
            status=M.STOPPED, reason=f"its host is lost ({why})"[:255], changed_at=Now()
        )
        workload = member.workload
        if gang_stop(workload, reason=f"member rank {member.rank}'s host {node.name} is lost", requeue=True):
            requeued.append(workload.pk)
        else:
            _step_soon(workload.pk)  # stopping already: this member was the one it waited for
    return requeued


def gangs_step_all() -> None:
    """The reconciliation beat's pass: step every gang that is on the move, stop gangs whose start has
    overrun ``TRANSITION_DEADLINE_S`` (a member's launch never came back), and end those past their
    maximum runtime."""
    now = db_now()
    overdue = now - timedelta(seconds=settings.TRANSITION_DEADLINE_S)
    joins_overdue(now)
    on_the_move = Workload.objects.filter(members__isnull=False, status__in=[S.STARTING, S.RUNNING, S.STOPPING])
    for workload in on_the_move.distinct():
        if (
            workload.status == S.RUNNING
            and workload.max_runtime_s
            and workload.started_at
            and (now - workload.started_at).total_seconds() > workload.max_runtime_s
        ):
            limit = f"exceeded its maximum runtime of {workload.max_runtime_s} s"
            gang_stop(workload, reason=f"{FAILED_PREFIX}{limit}", requeue=False)
            continue
        if gang_step(workload.pk) is None and workload.status == S.STARTING and workload.status_changed_at < overdue:
            what = f"a member did not start within {settings.TRANSITION_DEADLINE_S} s"
            again = workload.preemptions < settings.GANG_MAX_RESTARTS
            gang_stop(
                workload, reason=f"{what}; the gang starts again" if again else f"{FAILED_PREFIX}{what}", requeue=again
            )


def joins_overdue(now) -> None:
    """Members joining a running elastic gang (``services.elastic``): their launch sent again after
    ``LAUNCH_RESEND_S`` (its message may have been lost), and given up after ``TRANSITION_DEADLINE_S`` (the gang
    runs on without them: they leave, and ``gang_step`` gives their cards back)."""
    joining = WorkloadMember.objects.filter(status=M.STARTING, workload__status=S.RUNNING)
    resend = now - timedelta(seconds=settings.LAUNCH_RESEND_S)
    overdue = now - timedelta(seconds=settings.TRANSITION_DEADLINE_S)
    for member in joining.filter(changed_at__lt=resend):
        if member.changed_at < overdue:
            reason = f"did not start within {settings.TRANSITION_DEADLINE_S} s; the gang runs on without it"
            if WorkloadMember.objects.filter(pk=member.pk, status=M.STARTING).update(
                status=M.LEFT, reason=reason, changed_at=Now()
            ):
                gang_step(member.workload_id)  # (a launch still under way stops its container: member_running)
        else:
            send(ToNode.LAUNCH, member.workload_id, member.node_name, node=member.node_name)
