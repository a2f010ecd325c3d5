"""Scheduler-queue Celery tasks: thin wrappers that call the control plane.

The tasks a node agent serves (launch, stop, ... on queue ``node.<name>``)
live in ``scheduler.node.tasks``; they are sent by name, so the control plane
never imports node-side code.
"""

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from scheduler import tick
from scheduler.models import GpuMinute, Node, NodeStatus, WorkloadGpuMinute
from scheduler.services.nodes import nodes_mark_lost
from scheduler.services.workloads import NodeTask


@shared_task(ignore_result=True)
def schedule_tick():
    tick.schedule_tick()


@shared_task(ignore_result=True)
def cluster_reconcile():
    from config.celery import app

    nodes_mark_lost(silent_for=timedelta(seconds=settings.NODE_LOST_AFTER_S))
    for node in Node.objects.filter(status=NodeStatus.ACTIVE):
        app.send_task(NodeTask.RECONCILE, args=[node.name], queue=node.queue, expires=settings.NODE_LOST_AFTER_S)


@shared_task(ignore_result=True)
def telemetry_prune() -> int:
    """Delete GPU minute rollups older than TELEMETRY_RETENTION_DAYS."""
    cutoff = timezone.now() - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
    cards, _ = GpuMinute.objects.filter(minute__lt=cutoff).delete()
    shares, _ = WorkloadGpuMinute.objects.filter(minute__lt=cutoff).delete()
    return cards + shares
