"""The scheduler's own reaction to lifecycle facts: capacity freed -> tick again."""

from django.dispatch import receiver

from scheduler.services.lifecycle import HOLDING
from scheduler.signals import workload_changed


@receiver(workload_changed)
def tick_when_capacity_frees(sender, from_status, to_status, **kwargs):
    if from_status in HOLDING and to_status not in HOLDING:
        from scheduler.services.workloads import tick_soon

        tick_soon()
