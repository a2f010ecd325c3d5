"""Metering follows the lifecycle: open when really running, closed when it stops, never doubled."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.metering import meter_open, meter_reconcile
from billing.models import MeterSegment
from scheduler.models import WorkloadStatus as S
from scheduler.services.lifecycle import workload_transition
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_running_opens_a_segment_and_stopping_closes_it(user, django_capture_on_commit_callbacks):
    w = workload(user, status=S.STARTING)
    with django_capture_on_commit_callbacks(execute=True):
        workload_transition(w, to=S.RUNNING, allowed_from=[S.STARTING])
    segment = MeterSegment.objects.get(workload=w)
    assert segment.ended_at is None
    with django_capture_on_commit_callbacks(execute=True):
        workload_transition(w, to=S.STOPPING, allowed_from=[S.RUNNING], reason="stop requested")
    segment.refresh_from_db()
    assert segment.ended_at is not None and segment.seconds >= 0
    assert "stopping" in segment.end_reason


def test_queued_and_failed_to_start_work_is_never_metered(user, django_capture_on_commit_callbacks):
    w = workload(user, status=S.STARTING)
    with django_capture_on_commit_callbacks(execute=True):
        workload_transition(w, to=S.FAILED, allowed_from=[S.STARTING], reason="failed to start")
    assert not MeterSegment.objects.exists()


def test_opening_twice_keeps_one_open_segment(user):
    w = workload(user, status=S.RUNNING)
    meter_open(workload_id=w.pk)
    meter_open(workload_id=w.pk)
    assert MeterSegment.objects.filter(workload=w, ended_at__isnull=True).count() == 1


def test_a_failing_receiver_does_not_keep_metering_from_closing(user, django_capture_on_commit_callbacks, monkeypatch):
    from scheduler.services import workloads

    def redis_is_down():
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(workloads, "tick_soon", redis_is_down)  # the scheduler's own receiver runs first
    w = workload(user, status=S.STARTING)
    with django_capture_on_commit_callbacks(execute=True):
        workload_transition(w, to=S.RUNNING, allowed_from=[S.STARTING])
    with django_capture_on_commit_callbacks(execute=True):
        workload_transition(w, to=S.FAILED, allowed_from=[S.RUNNING], reason="container exited")

    segment = MeterSegment.objects.get(workload=w)
    assert segment.ended_at == w.events.get(to_status=S.FAILED).created_at


def run_without_receivers(w, *steps):
    """Transitions whose after-commit receivers never ran (the process died right after commit)."""
    for to, allowed in steps:
        assert workload_transition(
            w, to=to, allowed_from=[allowed], reason="r"
        )  # on_commit never fires in a test transaction


def test_reconciliation_rebuilds_the_segments_the_event_history_says_ran(user):
    w = workload(user, status=S.STARTING)
    run_without_receivers(
        w,
        (S.RUNNING, S.STARTING),
        (S.STOPPING, S.RUNNING),
        (S.STOPPED, S.STOPPING),
        (S.QUEUED, S.STOPPED),
        (S.STARTING, S.QUEUED),
        (S.RUNNING, S.STARTING),
    )
    assert not MeterSegment.objects.exists()

    assert meter_reconcile(since=timezone.now() - timedelta(hours=1)) == 2

    to_running = list(w.events.filter(to_status=S.RUNNING).values_list("created_at", flat=True))
    stop = w.events.get(to_status=S.STOPPING).created_at
    first, second = MeterSegment.objects.filter(workload=w).order_by("started_at")
    assert (first.started_at, first.ended_at) == (to_running[0], stop)
    assert (second.started_at, second.ended_at) == (to_running[1], None)
    assert meter_reconcile(since=timezone.now() - timedelta(hours=1)) == 0  # idempotent


def test_reconciliation_closes_a_segment_whose_close_was_lost(user):
    w = workload(user, status=S.STARTING)
    run_without_receivers(w, (S.RUNNING, S.STARTING))
    meter_open(workload_id=w.pk, at=w.events.get(to_status=S.RUNNING).created_at)
    run_without_receivers(w, (S.FAILED, S.RUNNING))

    assert meter_reconcile(since=timezone.now() - timedelta(hours=1)) == 1

    segment = MeterSegment.objects.get(workload=w)
    assert segment.ended_at == w.events.get(to_status=S.FAILED).created_at and "failed" in segment.end_reason
