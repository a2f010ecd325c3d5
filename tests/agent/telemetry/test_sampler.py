"""Sampling a node: simulated readings follow real containers, minutes roll up, idle work accrues slower."""

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from agent.launcher import LABEL, docker_client
from agent.telemetry.rollups import MinuteRollups
from agent.telemetry.sampler import Sampler
from agent.telemetry.simgpu import SimulatedBackend
from scheduler.models import GpuMinute, Workload, WorkloadGpuMinute, WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.telemetry.documents import (
    SHARED_CARD,
    Card,
    CardReading,
    ContainerUsage,
    Tenant,
    TenantReading,
    TenantShare,
)
from scheduler.tick import schedule_tick
from tests.conftest import make_node, wait_for
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def running_on(node, user, card, milli, *, container_id=""):
    w = workload(user, gpu_model=card.model, gpu_milli=milli)
    placed = allocation_create(
        workload=w, node_id=node.pk, shares=[Share(card.pk, milli, card.memory_mb * milli // 1000)]
    )
    assert placed
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
    idle = running_on(node, user, rtx, 300, container_id=containers["idle"].id)
    busy = running_on(node, user, a100, 1000, container_id=containers["busy"].id)
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=docker_client())

    def sampled():
        doc = sampler.sample_once()
        return doc if (doc["gpus"][1]["tenants"][0]["util"] or 0) > 0.7 else None

    doc = wait_for(sampled, timeout=20, what="the container spinning a core to read busy")
    shared, whole = doc["gpus"]
    [fraction], [card_holder] = shared["tenants"], whole["tenants"]
    assert doc["simulated"] is True and doc["v"] == 1 and card_holder["workload"] == busy.pk
    assert whole["util"] == pytest.approx(card_holder["util"], abs=1e-3)
    assert whole["power"] > shared["power"], "power follows utilization"
    assert fraction["workload"] == idle.pk and fraction["util"] is None, "a fraction of a card: no own compute"
    assert fraction["util_absent"] == SHARED_CARD and fraction["mem_used"] is not None
    assert shared["util"] < 0.1, "the card's own utilization is there, and the sleeping container keeps it low"
    sampler.close()


def test_a_simulated_fraction_reads_as_on_a_real_host_memory_and_the_card_but_no_own_compute():
    card = Card(0, "GPU-sim-0", "RTX3090", 24576)
    half = Tenant(1, "u1", "half", "instance", 1, "c" * 64, 2, 4096, (TenantShare(card.uuid, 500, 12288),))
    whole = Card(1, "GPU-sim-1", "RTX3090", 24576)
    single = Tenant(2, "u2", "whole", "job", 1, "d" * 64, 2, 4096, (TenantShare(whole.uuid, 1000, 24576),))
    usage = {"c" * 64: ContainerUsage(cpu=1.0, memory_mb=3000), "d" * 64: ContainerUsage(cpu=0.4, memory_mb=500)}
    [shared, alone], own = SimulatedBackend().sample([card, whole], [half, single], usage)
    assert own[(1, card.uuid)] == TenantReading(None, 3000, SHARED_CARD)
    assert shared.util == 0.5, "its busy half shows on the card"
    assert own[(2, whole.uuid)] == TenantReading(0.4, 500) and alone.util == 0.4, "a whole card keeps its reading"


def test_the_sampler_publishes_each_workloads_own_document(user, base_image, containers):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    w = running_on(node, user, card, 300, container_id=containers["idle"].id)
    sampler = Sampler(node, backend=SimulatedBackend(), docker_client=docker_client())
    sampler.sample_once()
    from scheduler.telemetry import streams

    [text] = streams.history_read(streams.workload_stream(node.name, w.pk), count=1)
    assert f'"workload":{w.pk}' in text and '"share":0.3' in text and f'"mem_cap":{card.memory_mb * 3 // 10}' in text
    assert streams.history_read(streams.node_stream(node.name), count=5)
    sampler.close()


def reading(uuid, util, mem=100, power=100.0):
    return CardReading(index=0, uuid=uuid, model="RTX3090", util=util, mem_used=mem, power=power)


@pytest.fixture
def half_card(user):
    """(a card, a workload running on half of it)."""
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    return card, running_on(node, user, card, 500)


def test_minutes_roll_up_into_rows_and_set_the_workloads_recent_utilization(half_card):
    card, w = half_card
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


def test_a_minute_without_a_reading_stores_null_and_the_workload_reads_unknown_not_idle(half_card):
    card, w = half_card
    rollups = MinuteRollups()
    start = (int(time.time()) // 60 - 3) * 60
    rollups.add(start, [reading(card.uuid, 0.0)], {(w.pk, card.uuid): TenantReading(0.0, 0)})  # no process yet
    rollups.flush(start + 60)
    w.refresh_from_db()
    assert w.gpu_utilization == 0.0, "an idle minute, measured"
    for second in range(3):  # then its process runs, under MPS: no per-tenant reading, its memory there
        own = {(w.pk, card.uuid): TenantReading(None, 4000, SHARED_CARD)}
        rollups.add(start + 60 + second, [reading(card.uuid, 1.0)], own)
    rollups.add(start + 120, [reading(card.uuid, 1.0)], {(w.pk, card.uuid): TenantReading(0.0, 0)})  # and ended
    rollups.add(start + 150, [reading(card.uuid, 1.0)], {(w.pk, card.uuid): TenantReading(None, 900, SHARED_CARD)})
    rollups.flush(start + 180)
    unread = WorkloadGpuMinute.objects.get(workload=w, minute=datetime.fromtimestamp(start + 60, UTC))
    assert (unread.util_avg, unread.util_max, unread.mem_max_mb) == (None, None, 4000), "NULL, not 0; memory kept"
    partly = WorkloadGpuMinute.objects.get(workload=w, minute=datetime.fromtimestamp(start + 120, UTC))
    assert partly.util_avg is None, "a minute read only in part is no reading: the unread seconds may be the busy ones"
    card_minute = GpuMinute.objects.get(gpu=card, minute=datetime.fromtimestamp(start + 60, UTC))
    assert card_minute.util_avg == 1.0, "the card's own minute stays"
    w.refresh_from_db()
    assert w.gpu_utilization is None, "unknown, not the idle minute before it"


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
