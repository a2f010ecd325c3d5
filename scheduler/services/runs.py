"""Runs: each start of a workload's container (a gang's member's too), numbered where its log lives."""

from django.db import IntegrityError, transaction
from django.db.models import Max

from scheduler.models import Node, Workload, WorkloadRun

TRIES = 20


def run_number_take(workload: Workload, node: Node, *, rank: int = 0) -> int:
    """Record a new run of ``workload`` on ``node`` (a gang's member: its ``rank``) and return its number,
    the next one. Without the workload's row lock (a member's host may not take it): two hosts numbering at
    once collide on the unique number and the later one takes the next."""
    for _ in range(TRIES):
        last = WorkloadRun.objects.filter(workload=workload).aggregate(last=Max("number"))["last"] or 0
        try:
            with transaction.atomic():
                WorkloadRun.objects.create(
                    workload=workload, number=last + 1, rank=rank, node=node, node_name=node.name
                )
        except IntegrityError:
            continue  # another host took it meanwhile
        return last + 1
    raise RuntimeError(f"no run number for workload {workload.pk} after {TRIES} tries")
