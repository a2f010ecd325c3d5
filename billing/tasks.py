"""Billing's Celery tasks (scheduler queue): thin wrappers over the metering services."""

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from billing.metering import meter_reconcile as reconcile

# Work whose events are older than this is settled: the live receivers and earlier runs covered it.
RECONCILE_WINDOW = timedelta(days=1)


@shared_task(ignore_result=True)
def meter_reconcile():
    reconcile(since=timezone.now() - RECONCILE_WINDOW)
