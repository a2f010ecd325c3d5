"""Nodes that stop sending heartbeats: marked lost by the control plane, with what that means for their work.

Only the database's clock is compared (``core.clock``), and only over time
the control plane was watching (``ClusterWatch``): a node is lost once it has
been silent for ``NODE_LOST_AFTER_S`` while the control plane was up to see it.

What a lost node's work becomes:
- a gang with a member there stops on its other hosts (SIGTERM, the grace to
  checkpoint) and is requeued as one (``gangs``);
- jobs are requeued to run anywhere; the node's agent has stopped them itself by
  then (``agent.selffence``: it fences its jobs well before this
  deadline), so a requeued job never runs twice;
- running instances stay running in the database, but their meter pauses at the
  host's last heartbeat (a host that lost power must not bill its tenants until it
  returns, nor empty their wallets meanwhile): the host may keep running them, and
  when it is heard again (``nodes.node_rejoin``) they are re-adopted as they are and
  charged again from then on; the time it was unreachable is not charged, whether
  they ran or not. A user's stop meanwhile takes effect at once (``workload_stop``)
  and the host stops the container when it returns; an operator who removes the
  node ends them (``node_remove``);
- instances still starting fail, stopping ones are stopped, releases complete:
  the host removes leftovers when it returns.
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from core.clock import db_now
from core.messages import ToNode, send_after_commit
from scheduler import sharedfs
from scheduler.models import ClusterWatch, MeterChange, Node, NodeStatus, Workload, WorkloadKind, WorkloadStatus
from scheduler.services.gangs import gangs_of_lost_node
from scheduler.services.lifecycle import workload_meter_change, workload_transition

S = WorkloadStatus


def control_plane_watching_since(now) -> object:
    """Record that the control plane looks now; returns since when it has looked without a gap.

    A gap longer than ``WATCH_GAP_S`` (the control plane itself was down) starts a new watch.
    """
    gap = timedelta(seconds=settings.WATCH_GAP_S)
    with transaction.atomic():
        watch = ClusterWatch.objects.select_for_update().filter(pk=1).first()
        if watch is None:
            watch = ClusterWatch.objects.create(pk=1, checked_at=now, watching_since=now)
        elif now - watch.checked_at > gap:
            watch.watching_since = watch.checked_at = now
            watch.save()
        else:
            watch.checked_at = now
            watch.save(update_fields=["checked_at"])
    return watch.watching_since


def nodes_mark_lost(*, silent_for: timedelta) -> list[str]:
    """Mark nodes whose agent has been silent too long, while the control plane watched, as lost."""
    now = db_now()
    cutoff = now - silent_for
    if control_plane_watching_since(now) > cutoff:
        return []  # not watched long enough (start-up, or back from an outage): give every node its full time
    lost = []
    for node in Node.objects.filter(status__in=[NodeStatus.ACTIVE, NodeStatus.DRAINING], last_heartbeat__lt=cutoff):
        if not Node.objects.filter(pk=node.pk, status=node.status, last_heartbeat__lt=cutoff).update(
            status=NodeStatus.LOST
        ):
            continue
        lost.append(node.name)
        work_of_lost_node_settle(node, why=f"node {node.name} stopped sending heartbeats")
    return lost


def work_of_lost_node_settle(node: Node, *, why: str) -> None:
    gangs_of_lost_node(node, why=why)  # each stops on its other hosts and is requeued as one
    for workload in Workload.objects.filter(node=node, status__in=S.holding_resources(), members__isnull=True):
        if workload.kind == WorkloadKind.JOB:
            workload_transition(
                workload,
                to=S.QUEUED,
                allowed_from=S.holding_resources(),
                reason=f"requeued: {why}",
                queued_at=Now(),
                node=None,
                pinned_node=None,
                preempt_requested=False,
                preemptions=workload.preemptions + 1,
            )
        elif workload.status == S.STARTING:
            workload_transition(
                workload,
                to=S.FAILED,
                allowed_from=[S.STARTING],
                reason=f"failed to start: {why}; start it again, or release it",
                finished_at=Now(),
            )
        elif workload.status == S.STOPPING:
            workload_transition(
                workload,
                to=S.STOPPED,
                allowed_from=[S.STOPPING],
                reason=f"stopped ({why}; it stops the container when it returns)",
                finished_at=Now(),
            )
        elif workload.status == S.RUNNING:  # an instance: it may go on running there, uncharged until heard again
            last_event = workload.events.order_by("-created_at", "-id").values_list("created_at", flat=True).first()
            workload_meter_change(
                workload,
                MeterChange.PAUSE,
                f"node {node.name} unreachable ({why}): not charged from its last heartbeat until it is heard again",
                at=max(filter(None, [node.last_heartbeat, last_event])),
            )
    for workload in Workload.objects.filter(Q(node=node) | Q(pinned_node=node), status=S.RELEASING):
        workload_release_on_lost_node(workload, node)


def workload_release_on_lost_node(workload: Workload, node: Node) -> bool:
    """Release work whose node is gone: done now; the node removes its container and disk when it returns.

    A job's checkpoint folder on the shared storage is removed now by another active host (any: they all mount
    it), or, with none, by its own host when it returns (its reconcile)."""
    released = workload_transition(
        workload,
        to=S.RELEASED,
        allowed_from=[S.RELEASING, S.STOPPED, S.FAILED, S.SUCCEEDED, S.QUEUED],
        reason=f"released; its container and disk are removed from node {node.name} when it returns",
        finished_at=Now(),
    )
    if released and workload.kind == WorkloadKind.JOB and sharedfs.enabled():
        other = Node.objects.filter(status=NodeStatus.ACTIVE).exclude(pk=node.pk).order_by("?").first()
        if other is not None:
            send_after_commit(ToNode.CHECKPOINTS_REMOVE, workload.owner_id, workload.uid, node=other.name, robust=True)
    return released


def workload_stop_on_lost_node(workload: Workload, node: Node, *, reason: str) -> bool:
    """Stop running work on an unreachable node now (metering ends now); the node stops its container on return."""
    return workload_transition(
        workload,
        to=S.STOPPED,
        allowed_from=[S.RUNNING, S.STARTING],
        reason=f"{reason or 'stopped'} (node {node.name} is unreachable: it stops the container when it returns)",
        finished_at=Now(),
    )
