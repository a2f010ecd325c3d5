"""Open and close meter segments, and reconcile them with the workload event history.

Segments start and end at the times of the events that record the container
really running and really stopping. The live receivers open and close them as
events happen; ``meter_reconcile`` rebuilds the same boundaries from the event
history and repairs whatever a lost receiver call (a crash after commit) left
behind. Every step is idempotent: safe to repeat after a crash.
"""

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import MeterSegment
from scheduler.models import MeterChange, Workload, WorkloadEvent, WorkloadStatus

RUNNING = WorkloadStatus.RUNNING
# A segment opened by the live receiver before its start was taken from the event
# (older rows) matches an interval whose start is this close.
MATCH_WITHIN = timedelta(seconds=5)


def meter_open(*, workload_id: int, at=None) -> None:
    try:
        with transaction.atomic():
            # Started without cards: the whole run is at the no-GPU price (its cards come back only
            # with a new start, which opens a new segment).
            # Spot or on-demand as it starts: a spot job that falls back to on-demand does so between runs.
            # The cards it holds now: an elastic job's size changes between runs, or while it runs when a
            # member joins or leaves (then a resize closes one segment and opens the next: receivers).
            no_gpu, spot, cards = Workload.objects.filter(pk=workload_id).values_list(
                "no_gpu", "spot", "gpu_count"
            ).first() or (False, False, None)
            MeterSegment.objects.create(
                workload_id=workload_id, started_at=at or timezone.now(), no_gpu=no_gpu, spot=spot, cards=cards
            )
    except IntegrityError:
        pass  # already open (or already recorded): the unique constraints make this a no-op


def meter_close(*, workload_id: int, reason: str, at=None) -> None:
    MeterSegment.objects.filter(workload_id=workload_id, ended_at__isnull=True).update(
        ended_at=at or timezone.now(), end_reason=reason[:255]
    )


def running_intervals(events) -> list[tuple[datetime, datetime | None, str]]:
    """(start, end or None while still running, end reason) for each stretch the events say ran and charge:
    a pause of the meter (its host lost) ends one, its resume (the host back, the work still running) starts one,
    a resize (an elastic gang's member joined or left) ends one and starts the next at the same time."""
    intervals = []
    start = None
    for event in events:
        if event.meter == MeterChange.PAUSE and start is not None:
            intervals.append((start, event.created_at, f"not charged: {event.reason}"))
            start = None
        elif event.meter == MeterChange.RESIZE and start is not None:
            intervals.append((start, event.created_at, f"resized: {event.reason}"))
            start = event.created_at
        elif event.meter == MeterChange.RESUME and event.to_status == RUNNING and start is None:
            start = event.created_at
        elif event.to_status == RUNNING and event.from_status != RUNNING and start is None:
            start = event.created_at
        elif event.from_status == RUNNING and event.to_status != RUNNING and start is not None:
            intervals.append((start, event.created_at, f"{event.to_status}: {event.reason}"))
            start = None
    if start is not None:
        intervals.append((start, None, ""))
    return intervals


def meter_reconcile(*, since: datetime) -> int:
    """Make the segments of work that changed since ``since`` (or is metered now) match its events.

    Returns how many segments were created or closed.
    """
    workload_ids = set(WorkloadEvent.objects.filter(created_at__gte=since).values_list("workload_id", flat=True))
    workload_ids |= set(MeterSegment.objects.filter(ended_at__isnull=True).values_list("workload_id", flat=True))
    return sum(_reconcile_workload(workload_id) for workload_id in workload_ids)


def _reconcile_workload(workload_id: int) -> int:
    events = WorkloadEvent.objects.filter(workload_id=workload_id).order_by("created_at", "id")
    segments = list(MeterSegment.objects.filter(workload_id=workload_id))
    spot = Workload.objects.filter(pk=workload_id).values_list("spot", flat=True).first() or False
    fixed = 0
    for start, end, reason in running_intervals(events):
        segment = next((s for s in segments if abs(s.started_at - start) <= MATCH_WITHIN), None)
        if segment is None:
            try:
                with transaction.atomic():
                    MeterSegment.objects.create(
                        workload_id=workload_id, started_at=start, ended_at=end, end_reason=reason, spot=spot
                    )
                fixed += 1
            except IntegrityError:
                pass  # the live receiver recorded it meanwhile
        elif segment.ended_at is None and end is not None:
            fixed += MeterSegment.objects.filter(pk=segment.pk, ended_at__isnull=True).update(
                ended_at=end, end_reason=reason[:255]
            )
    return fixed
