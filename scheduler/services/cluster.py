"""The control plane's reconciliation beat (every ``RECONCILE_S``): one pass over the whole cluster.

It marks silent nodes lost (``node_loss``), moves draining nodes on
(``nodes.nodes_drain_step``), sends again the launches whose message was lost
after commit, fails moves that stopped making progress, folds the workloads' disk deltas
(``disk_delta_fold``), and asks every node in service to converge with its Docker
engine (``agent.reconcile``).
"""

from datetime import timedelta

from django.conf import settings
from django.db import connection

from core.clock import db_now
from core.messages import ToNode, send
from scheduler.models import MemberStatus, Node, NodeStatus, Workload, WorkloadMember, WorkloadStatus
from scheduler.services.gangs import gangs_step_all
from scheduler.services.moves import moves_stalled_fail
from scheduler.services.node_loss import nodes_mark_lost
from scheduler.services.nodes import nodes_drain_step

IN_SERVICE = [NodeStatus.ACTIVE, NodeStatus.DRAINING]


def cluster_reconcile() -> None:
    nodes_mark_lost(silent_for=timedelta(seconds=settings.NODE_LOST_AFTER_S))
    nodes_drain_step()
    launches_resend()
    gangs_step_all()
    moves_stalled_fail()
    disk_delta_fold()
    for node in Node.objects.filter(status__in=IN_SERVICE):
        send(ToNode.RECONCILE, node.name, node=node.name)


def launches_resend() -> list[int]:
    """Send the launch of work starting for over ``LAUNCH_RESEND_S`` to its node again.

    Its message may have been lost after the placement committed (Redis restarted
    without it, a send that failed): a launch is idempotent on the node (it runs
    once, however often it arrives), so sending again is safe, and the work runs
    instead of failing at its transition deadline.
    """
    cutoff = db_now() - timedelta(seconds=settings.LAUNCH_RESEND_S)
    stale = Workload.objects.filter(
        status=WorkloadStatus.STARTING, status_changed_at__lt=cutoff, node__status__in=IN_SERVICE
    ).select_related("node")
    resent = []
    for workload in stale:
        # A gang's members still starting, each on its node; other work on its node.
        members = WorkloadMember.objects.filter(workload=workload, status=MemberStatus.STARTING)
        for node_name in [m.node_name for m in members] or ([] if workload.members.exists() else [workload.node.name]):
            send(ToNode.LAUNCH, workload.pk, node_name, node=node_name)
        resent.append(workload.pk)
    return resent


def disk_delta_fold(*, slack: int = 100) -> int:
    """Fold the workloads' disk deltas (``DiskDelta``) into one row per node (none where they sum to nothing) once
    there are more than two a node and ``slack``; returns the rows folded (0: not yet). Rows written meanwhile by
    transactions the fold does not see stay as they are, so nothing is counted twice or lost; PostgreSQL only."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT node_id) FROM scheduler_diskdelta")
        rows, nodes = cursor.fetchone()
        if rows <= 2 * nodes + slack:
            return 0
        cursor.execute(
            "WITH gone AS (DELETE FROM scheduler_diskdelta RETURNING node_id, gb, containers) "
            "INSERT INTO scheduler_diskdelta (node_id, gb, containers) "
            "SELECT node_id, sum(gb), sum(containers) FROM gone GROUP BY node_id "
            "HAVING sum(gb) <> 0 OR sum(containers) <> 0"
        )
    return rows
