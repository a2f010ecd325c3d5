"""Metering follows the lifecycle: open when really running, closed when it stops, never doubled."""

import pytest

from billing.metering import meter_open
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
