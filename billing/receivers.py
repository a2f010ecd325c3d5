"""Billing follows the scheduler's lifecycle facts: running opens metering, leaving it closes."""

from django.dispatch import receiver

from billing.metering import meter_close, meter_open
from scheduler.models import WorkloadStatus
from scheduler.signals import workload_changed


@receiver(workload_changed)
def meter_on_lifecycle(sender, workload_id, from_status, to_status, reason, at, **kwargs):
    # Segments start and end at the event's own time, so reconciliation from the event
    # history (billing.metering.meter_reconcile) finds exactly the same boundaries.
    if to_status == WorkloadStatus.RUNNING and from_status != WorkloadStatus.RUNNING:
        meter_open(workload_id=workload_id, at=at)
    elif from_status == WorkloadStatus.RUNNING and to_status != WorkloadStatus.RUNNING:
        meter_close(workload_id=workload_id, reason=f"{to_status}: {reason}", at=at)
