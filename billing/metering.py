"""Open and close meter segments; both are idempotent (safe to repeat after a crash)."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import MeterSegment


def meter_open(*, workload_id: int, at=None) -> None:
    try:
        with transaction.atomic():
            MeterSegment.objects.create(workload_id=workload_id, started_at=at or timezone.now())
    except IntegrityError:
        pass  # already open: the unique constraint on open segments makes this a no-op


def meter_close(*, workload_id: int, reason: str, at=None) -> None:
    MeterSegment.objects.filter(workload_id=workload_id, ended_at__isnull=True).update(
        ended_at=at or timezone.now(), end_reason=reason[:255]
    )
