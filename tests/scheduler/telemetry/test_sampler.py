"""Sampling a node: simulated readings follow real containers, minutes roll up, idle work accrues slower."""

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from scheduler.models import GpuMinute, Workload, WorkloadGpuMinute, WorkloadStatus
from scheduler.node.launcher import LABEL, docker_client
from scheduler.services.allocation import Share, allocation_create
from scheduler.telemetry.documents import CardReading, TenantReading
from scheduler.telemetry.rollups import MinuteRollups
from scheduler.telemetry.sampler import Sampler
from scheduler.telemetry.simgpu import SimulatedBackend
from scheduler.tick import schedule_tick
from tests.conftest import make_node, wait_for
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def running_on(node, user, card, milli, *, container_id=""):
    w = workload(user, gpu_milli=milli)
    allocation_create(workload=w, node_id=node.pk, shares=[Share(card.pk, milli, card.memory_mb * milli // 1000)])
    Workload.objects.filter(pk=w.pk).update(
        status=WorkloadStatus.RUNNING, started_at=timezone.now(), container_id=container_id
    )
    w.refresh_from_db()
    return w


@pytest.fixture
def containers(base_image):
    """Two real containers: one spinning a CPU core, one asleep."""
    client = docker_client()
    tag = uuid.uuid4().hex[:8]
    made = {
        name: client.containers.run(
            base_image,
            ["sh", "-c", command],
            detach=True,
            name=f"test-telemetry-{name}-{tag}",
            labels={f"{LABEL}.test": "telemetry"},
            network_mode="none",
        )
        for name, command in (("busy", "while :; do :; done"), ("idle", "sleep 3600"))
    }
    yield made
    for container in made.values():
        container.remove(force=True)


def test_the_simulated_card_follows_its_tenants_real_cpu_activity(user, base_image, containers):
    node = make_node("sim:1xRTX3090,1xA100-80GB")
    rtx, a100 = node.gpus.order_by("index")
    busy = running_on(node, user, rtx, 500, container_id=containers["busy"].id)
    idle = running_on(node, user, rtx, 300, container_id=containers["idle"].id)
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=docker_client())

    def sampled():
        doc = sampler.sample_once()
        tenants = {t["workload"]: t for t in doc["gpus"][0]["tenants"]}
        return doc if all(t["util"] is not None for t in tenants.values()) else None

    doc = wait_for(sampled, timeout=20, what="a CPU rate for both containers")
    card, empty = doc["gpus"]
    tenants = {t["workload"]: t for t in card["tenants"]}
    assert doc["simulated"] is True and doc["v"] == 1
    assert tenants[busy.pk]["util"] > 0.7, "a container spinning a core reads a busy GPU share"
    assert tenants[idle.pk]["util"] < 0.1, "a sleeping container reads an idle GPU share"
    assert card["util"] == pytest.approx(0.5 * tenants[busy.pk]["util"] + 0.3 * tenants[idle.pk]["util"], abs=1e-3)
    assert card["power"] > empty["power"], "power follows utilization"
    assert empty["util"] == 0 and empty["tenants"] == []
    sampler.close()


def test_the_sampler_publishes_each_workloads_own_document(user, base_image, containers):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    w = running_on(node, user, card, 300, container_id=containers["idle"].id)
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=docker_client())
    sampler.sample_once()
    from scheduler.telemetry import streams

    [text] = streams.history_read(streams.workload_stream(w.pk), count=1)
    assert f'"workload":{w.pk}' in text and '"share":0.3' in text and f'"mem_cap":{card.memory_mb * 3 // 10}' in text
    assert streams.history_read(streams.node_stream(node.name), count=5)
    sampler.close()


def reading(uuid, util, mem=100, power=100.0):
    return CardReading(index=0, uuid=uuid, model="RTX3090", util=util, mem_used=mem, power=power)


def test_minutes_roll_up_into_rows_and_set_the_workloads_recent_utilization(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    w = running_on(node, user, card, 500)
    rollups = MinuteRollups()
    start = (int(time.time()) // 60 - 2) * 60
    for second, (card_util, own) in enumerate([(0.2, 0.4), (0.4, 0.8), (0.0, 0.0)]):
        own_reading = {(w.pk, card.uuid): TenantReading(own, 50)}
        rollups.add(start + second, [reading(card.uuid, card_util, mem=100 * second)], own_reading)
    rollups.add(start + 61, [reading(card.uuid, 1.0)], {})
    assert rollups.flush(start + 59) == 0, "a minute still running is not written"
    assert rollups.flush(start + 125) == 3
    first = GpuMinute.objects.get(gpu=card, minute=datetime.fromtimestamp(start, UTC))
    assert (first.samples, first.util_max, first.mem_max_mb) == (3, 0.4, 200)
    assert first.util_avg == pytest.approx(0.2)
    share = WorkloadGpuMinute.objects.get(workload=w)
    assert share.util_avg == pytest.approx(0.4) and share.mem_max_mb == 50
    w.refresh_from_db()
    assert w.gpu_utilization == pytest.approx(0.4)
    assert GpuMinute.objects.filter(gpu=card).count() == 2


def test_a_minute_written_again_is_replaced_not_doubled(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    start = (int(time.time()) // 60 - 2) * 60
    for util in (0.1, 0.9):  # an agent restarted inside the minute writes what it saw since
        rollups = MinuteRollups()
        rollups.add(start + 30, [reading(card.uuid, util)], {})
        rollups.flush(start + 60)
    assert list(GpuMinute.objects.filter(gpu=card).values_list("util_avg", flat=True)) == [0.9]


@pytest.mark.parametrize(("utilization", "expected"), [(None, 100.0), (0.95, 100.0), (0.05, 25.0)])
def test_the_tick_accrues_gpu_seconds_slower_for_idle_work(user, settings, utilization, expected):
    settings.SCHEDULER_IDLE_WEIGHT = 0.25
    node = make_node("sim:1xRTX3090")
    w = running_on(node, user, node.gpus.get(), 1000)
    Workload.objects.filter(pk=w.pk).update(
        gpu_utilization=utilization, accrued_at=timezone.now() - timedelta(seconds=100)
    )
    schedule_tick()
    w.refresh_from_db()
    assert w.attained_service == pytest.approx(expected, rel=0.05)


def test_minutes_past_the_retention_are_pruned(user, settings):
    from scheduler.tasks import telemetry_prune

    settings.TELEMETRY_RETENTION_DAYS = 7
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    now = timezone.now().replace(second=0, microsecond=0)
    for age in (timedelta(days=8), timedelta(days=6)):
        GpuMinute.objects.create(minute=now - age, gpu=card, samples=60, util_avg=0.5)
    assert telemetry_prune() == 1
    assert GpuMinute.objects.get().minute == now - timedelta(days=6)
