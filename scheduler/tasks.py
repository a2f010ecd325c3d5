"""Scheduler-queue Celery tasks: thin wrappers that call the control plane.

Each is registered under its name in ``core.messages.ToScheduler``. The
tasks a node agent serves live in ``agent.tasks``; the control plane
sends them by their ``ToNode`` name and never imports node-side code.
"""

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from core.messages import ToScheduler
from core.signing import sent_by
from scheduler import sharedfs, tick
from scheduler.models import GpuMinute, WorkloadGpuMinute
from scheduler.services import cluster, gangs, moves


@shared_task(name=ToScheduler.SCHEDULE_TICK, ignore_result=True)
def schedule_tick():
    tick.schedule_tick()


@shared_task(name=ToScheduler.CLUSTER_RECONCILE, ignore_result=True)
def cluster_reconcile():
    cluster.cluster_reconcile()


@shared_task(name=ToScheduler.GANG_STEP, ignore_result=True)
def gang_step(workload_id: int):
    gangs.gang_step(workload_id)
    gangs.gang_tell(workload_id)


@shared_task(name=ToScheduler.TELEMETRY_PRUNE, ignore_result=True)
def telemetry_prune() -> int:
    """Delete GPU minute rollups older than TELEMETRY_RETENTION_DAYS."""
    cutoff = timezone.now() - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
    cards, _ = GpuMinute.objects.filter(minute__lt=cutoff).delete()
    shares, _ = WorkloadGpuMinute.objects.filter(minute__lt=cutoff).delete()
    return cards + shares


@shared_task(name=ToScheduler.SHARED_STORAGE_USER, ignore_result=True)
def shared_storage_user(user_id: int):
    """The user's shared storage directory with its quota (``scheduler.sharedfs.user_ensure``)."""
    sharedfs.user_ensure(user_id)


@shared_task(name=ToScheduler.MOVE_REPORT, ignore_result=True)
def move_report(move_id: int, report: dict):
    moves.move_report(move_id, report, host=sent_by())
