"""A busy fraction of a card under MPS, end to end: NVML -> sampler -> minute rollups -> the tick's accrual.

NVML is fed what an H200 under classic MPS answered (``test_nvml.fake_nvml``: the utilization samples name the
MPS server alone); the sampler, the rollups and the tick are the real ones, on PostgreSQL and Redis.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.telemetry.nvml import NvmlBackend
from agent.telemetry.sampler import Sampler, node_cards
from scheduler.models import Workload, WorkloadGpuMinute
from scheduler.tick import schedule_tick
from tests.agent.telemetry.test_nvml import CID_A, MIB, SERVER, SERVER_NAME, fake_nvml, proc  # noqa: F401 (a fixture)
from tests.agent.telemetry.test_sampler import running_on
from tests.conftest import make_node

pytestmark = pytest.mark.django_db


def test_a_busy_fraction_under_mps_is_never_idle_to_the_scheduler(user, proc, settings):  # noqa: F811
    settings.SCHEDULER_IDLE_UTIL, settings.SCHEDULER_IDLE_WEIGHT = 0.3, 0.25
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    w = running_on(node, user, card, 500, container_id=CID_A)
    nvml = fake_nvml(
        processes=[(SERVER, 30 * MIB), (101, 12000 * MIB)],
        mps_clients=[(101, 12000 * MIB)],
        samples=[(SERVER, 97, 5)],  # the card is busy; only the server is credited with it
        names=SERVER_NAME,
        gpu_util=100,
    )
    backend = NvmlBackend(node_cards(node.name), nvml=nvml, proc=proc)
    minute = (int(timezone.now().timestamp()) // 60 - 2) * 60
    clock = iter(range(minute, minute + 60, 10))
    sampler = Sampler(node, backend=backend, docker_client=None, clock=lambda: next(clock))
    for _ in range(6):
        doc = sampler.sample_once()
    [holder] = doc["gpus"][0]["tenants"]
    assert (holder["util"], holder["util_absent"], holder["mem_used"]) == (None, "shared-card", 12000)
    assert sampler.rollups.flush(minute + 60) == 2
    row = WorkloadGpuMinute.objects.get(workload=w)
    assert (row.util_avg, row.mem_max_mb) == (None, 12000)

    Workload.objects.filter(pk=w.pk).update(accrued_at=timezone.now() - timedelta(seconds=100))
    schedule_tick()
    w.refresh_from_db()
    assert w.gpu_utilization is None
    assert w.attained_service == pytest.approx(0.5 * 100, rel=0.05), "the full rate: no idle discount (12.5)"
