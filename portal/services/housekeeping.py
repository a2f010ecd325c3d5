"""Let idle instances sleep, and clear out long-stopped ones.

- **Idle auto-stop** (dstack's ``min_gpu_utilization`` is the reference): a
  running instance whose GPUs stayed below its ``idle_util_percent`` for its
  last ``idle_minutes`` minutes (the monitoring's minute rollups, each minute's
  peak utilization of its share) is warned in the console, and stopped
  ``IDLE_WARNING_S`` later if still idle. One busy minute clears the warning,
  and so does one minute without a reading: a fraction of a card under MPS has
  no per-tenant compute reading while its processes run (``agent.telemetry.nvml``),
  and work is never stopped for lack of one.
  A ``stop_at`` time stops it then, warned ``IDLE_WARNING_S`` before.
- **Housekeeping**: an instance stopped (or failed) for ``HOUSEKEEPING_DAYS``
  (15, as AutoDL) is released — container, data disk — after the console has
  said when for the last ``HOUSEKEEPING_WARNING_DAYS``. A job that ended
  (succeeded, failed or cancelled) that long ago is released too: its volume and
  its checkpoint folder (AUTO_TMPDIR) on the shared storage go, which count
  against its owner's quota and are charged until then; the job's page and API
  (``kept_until``) say when from the moment it ends.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max, Q
from django.utils import timezone

from core.errors import Conflict
from portal.models import Instance, Job
from scheduler.models import WorkloadGpuMinute, WorkloadStatus
from scheduler.services.workloads import workload_release, workload_stop

log = logging.getLogger(__name__)


def idle_for(instance: Instance, now) -> bool:
    """Its GPUs read below the threshold in each of its last ``idle_minutes`` whole minutes, on every card."""
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=instance.idle_minutes)
    started = instance.workload.started_at
    if started is None or started > since:
        return False  # not running long enough to tell
    read = Q(util_max__isnull=False)
    minutes = WorkloadGpuMinute.objects.filter(workload=instance.workload, minute__gte=since).aggregate(
        n=Count("minute", distinct=True, filter=read), unread=Count("pk", filter=~read), peak=Max("util_max")
    )
    if minutes["unread"] or minutes["n"] < instance.idle_minutes:
        return False  # gaps in the samples, or minutes without a reading: no verdict from missing data
    return minutes["peak"] * 100 < instance.idle_util_percent


def stop_reason(instance: Instance, now) -> str | None:
    """Why this running instance is due to stop, or None."""
    if instance.stop_at is not None and now >= instance.stop_at - timedelta(seconds=settings.IDLE_WARNING_S):
        return f"scheduled stop at {instance.stop_at:%Y-%m-%d %H:%M} UTC"
    if instance.idle_util_percent is not None and idle_for(instance, now):
        return f"idle: GPU below {instance.idle_util_percent}% for {instance.idle_minutes} min"
    return None


def idle_stop(now=None) -> list[int]:
    """Warn, then stop; returns the instances asked to stop."""
    now = now or timezone.now()
    stopped = []
    running = Instance.objects.filter(workload__status=WorkloadStatus.RUNNING).select_related("workload")
    for instance in running.exclude(idle_util_percent__isnull=True, stop_at__isnull=True):
        why = stop_reason(instance, now)
        if why is None:
            if instance.stop_warned_at is not None:
                Instance.objects.filter(pk=instance.pk).update(stop_warned_at=None)
            continue
        if instance.stop_warned_at is None:
            Instance.objects.filter(pk=instance.pk).update(stop_warned_at=now)
            continue
        due = instance.stop_at if instance.stop_at and why.startswith("scheduled") else None
        if now - instance.stop_warned_at >= timedelta(seconds=settings.IDLE_WARNING_S) or (due and now >= due):
            try:
                workload_stop(instance.workload, reason=f"stopped: {why}")
            except Conflict:
                continue
            Instance.objects.filter(pk=instance.pk).update(stop_warned_at=None, stop_at=None)
            stopped.append(instance.pk)
    return stopped


def release_due_at(instance: Instance):
    """When housekeeping releases this stopped instance (None while it runs or queues)."""
    workload = instance.workload
    if workload.status not in (WorkloadStatus.STOPPED, WorkloadStatus.FAILED) or workload.status_changed_at is None:
        return None
    return workload.status_changed_at + timedelta(days=settings.HOUSEKEEPING_DAYS)


JOB_ENDED = (WorkloadStatus.SUCCEEDED, WorkloadStatus.FAILED, WorkloadStatus.STOPPED)


def job_kept_until(job: Job):
    """When housekeeping releases this ended job with its checkpoints (None while it queues or runs)."""
    workload = job.workload
    if workload.status not in JOB_ENDED or workload.status_changed_at is None:
        return None
    return workload.status_changed_at + timedelta(days=settings.HOUSEKEEPING_DAYS)


def housekeeping(now=None) -> list[int]:
    """Release instances stopped, and jobs ended, HOUSEKEEPING_DAYS ago; returns their workloads."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.HOUSEKEEPING_DAYS)
    released = []
    old = [
        *Instance.objects.filter(
            workload__status__in=[WorkloadStatus.STOPPED, WorkloadStatus.FAILED], workload__status_changed_at__lt=cutoff
        ).select_related("workload"),
        *Job.objects.filter(workload__status__in=JOB_ENDED, workload__status_changed_at__lt=cutoff).select_related(
            "workload"
        ),
    ]
    for work in old:
        try:
            workload_release(work.workload)
        except Conflict:
            continue
        kind = work.workload.kind
        log.info("released %s %s: %s since %s", kind, work.pk, work.workload.status, work.workload.status_changed_at)
        released.append(work.workload_id)
    return released
