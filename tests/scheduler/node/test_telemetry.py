"""Measured utilization: folded into a running mean, and slowing service accrual when the GPU idles."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import Workload, WorkloadStatus
from scheduler.node.telemetry import GpuSample, utilization_record
from scheduler.services.allocation import Share, allocation_create
from scheduler.tick import schedule_tick
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    w = workload(user)
    allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    Workload.objects.filter(pk=w.pk).update(status=WorkloadStatus.RUNNING, started_at=timezone.now())
    w.refresh_from_db()
    return node, card, w


def test_samples_fold_into_a_running_mean_per_workload(running):
    node, card, w = running
    assert utilization_record(node_name=node.name, samples=[GpuSample(card.uuid, 0.1, 100)]) == 1
    w.refresh_from_db()
    assert w.gpu_utilization == pytest.approx(0.1)
    utilization_record(node_name=node.name, samples=[GpuSample(card.uuid, 0.6, 100)])
    w.refresh_from_db()
    assert w.gpu_utilization == pytest.approx(0.2)
    assert utilization_record(node_name=node.name, samples=[GpuSample("GPU-other", 0.9, 1)]) == 0


@pytest.mark.parametrize(("utilization", "expected"), [(None, 100.0), (0.95, 100.0), (0.05, 25.0)])
def test_the_tick_accrues_gpu_seconds_slower_for_idle_work(running, settings, utilization, expected):
    settings.SCHEDULER_IDLE_WEIGHT = 0.25
    node, card, w = running
    Workload.objects.filter(pk=w.pk).update(
        gpu_utilization=utilization, accrued_at=timezone.now() - timedelta(seconds=100)
    )
    schedule_tick()
    w.refresh_from_db()
    assert w.attained_service == pytest.approx(expected, rel=0.05)
