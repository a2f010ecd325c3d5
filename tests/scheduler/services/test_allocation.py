"""Allocations under row locks: the card and node limits hold, whoever races."""

import threading

import pytest
from django.db import IntegrityError, connection, transaction

from scheduler.models import Allocation, Gpu, Node, WorkloadEvent, WorkloadStatus
from scheduler.services.allocation import Share, allocation_create
from scheduler.services.lifecycle import workload_transition
from scheduler.tick import schedule_tick
from tests.conftest import make_node, remove_node_containers
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    node = make_node("sim:1xRTX3090")
    yield node
    remove_node_containers(node.name)


def half(card):
    return dict(node_id=card.node_id, shares=[Share(card.pk, 500, card.memory_mb // 2)])


def quarter(card):
    return dict(node_id=card.node_id, shares=[Share(card.pk, 250, card.memory_mb // 4)])


def one_size_per_card(cards):
    """Every card holds fractions of one size at most (its MPS daemon's limits are per card)."""
    for card in cards:
        sizes = set(card.allocations.filter(milli__lt=1000).values_list("milli", flat=True))
        assert len(sizes) <= 1, f"{card} holds fractions of sizes {sorted(sizes)}"


def test_a_placement_takes_share_memory_cpu_and_moves_work_to_starting(user, node):
    card = node.gpus.get()
    w = workload(user, gpu_milli=500, cpu=2, memory_mb=2048)
    assert allocation_create(workload=w, **half(card))
    card.refresh_from_db()
    node.refresh_from_db()
    assert (card.allocated_milli, card.allocated_memory_mb) == (500, card.memory_mb // 2)
    assert (node.allocated_cpu, node.allocated_memory_mb) == (2, 2048)
    assert w.status == WorkloadStatus.STARTING and w.node == node
    assert WorkloadEvent.objects.filter(workload=w, to_status="starting").exists()


def test_leaving_the_holding_states_frees_everything(user, node):
    card = node.gpus.get()
    w = workload(user, gpu_milli=500, cpu=2, memory_mb=2048)
    allocation_create(workload=w, **half(card))
    assert workload_transition(w, to=WorkloadStatus.FAILED, allowed_from=[WorkloadStatus.STARTING], reason="x")
    card.refresh_from_db()
    node.refresh_from_db()
    assert (card.allocated_milli, card.allocated_memory_mb, node.allocated_cpu, node.allocated_memory_mb) == (
        0,
        0,
        0,
        0,
    )
    assert not Allocation.objects.filter(workload=w).exists()


def test_a_stale_placement_is_refused_under_the_lock(user, node):
    card = node.gpus.get()
    first, second, third = (workload(user, gpu_milli=500) for _ in range(3))
    assert allocation_create(workload=first, **half(card))
    assert allocation_create(workload=second, **half(card))
    assert not allocation_create(workload=third, **half(card))
    third.refresh_from_db()
    assert third.status == WorkloadStatus.QUEUED
    card.refresh_from_db()
    assert card.allocated_milli == 1000


def test_a_fraction_of_another_size_is_refused_under_the_lock(user, node):
    card = node.gpus.get()
    holder, other = workload(user, gpu_milli=250), workload(user, gpu_milli=500)
    assert allocation_create(workload=holder, **quarter(card))
    assert not allocation_create(workload=other, **half(card))  # a stale plan: the share would fit
    other.refresh_from_db()
    assert other.status == WorkloadStatus.QUEUED
    card.refresh_from_db()
    assert card.allocated_milli == 250
    assert allocation_create(workload=workload(user, gpu_milli=250), **quarter(card))


def test_a_card_that_empties_takes_any_size_again(user, node):
    card = node.gpus.get()
    w = workload(user, gpu_milli=250)
    assert allocation_create(workload=w, **quarter(card))
    assert workload_transition(w, to=WorkloadStatus.FAILED, allowed_from=[WorkloadStatus.STARTING], reason="x")
    assert allocation_create(workload=workload(user, gpu_milli=500), **half(card))


def test_a_batch_never_puts_two_sizes_on_one_empty_card(user, node):
    from scheduler.services.allocation import Placement, allocations_create

    card = node.gpus.get()
    small, large = workload(user, gpu_milli=250), workload(user, gpu_milli=500)
    placed = allocations_create(
        [Placement(small, node.pk, quarter(card)["shares"]), Placement(large, node.pk, half(card)["shares"])]
    )
    assert [p.workload.pk for p in placed] == [small.pk]
    one_size_per_card([card])


def test_the_database_itself_refuses_a_card_beyond_one(node):
    card = node.gpus.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Gpu.objects.filter(pk=card.pk).update(allocated_milli=1001)
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=node.pk).update(allocated_cpu=node.cpu_cores + 1)


def test_the_tick_places_what_fits_and_leaves_the_rest_queued(user, node):
    fits = [workload(user, gpu_milli=500), workload(user, gpu_milli=500)]
    waits = workload(user, gpu_milli=100)
    assert sorted(schedule_tick().placed) == sorted(w.pk for w in fits)
    waits.refresh_from_db()
    assert waits.status == WorkloadStatus.QUEUED
    assert waits.queue_position == 1 and "has 0.1 free" in waits.status_reason


def placed_at_once(placements: list[tuple]) -> list[bool]:
    """``allocation_create(workload=w, **where)`` for each (w, where), in threads released together."""
    if connection.vendor != "postgresql":
        pytest.fail("this race is only meaningful on PostgreSQL: run with DATABASE_URL set (make test does)")
    barrier = threading.Barrier(len(placements))
    results = {}

    def place(i, w, where):
        try:
            barrier.wait()
            results[i] = allocation_create(workload=w, **where)
        finally:
            connection.close()

    threads = [threading.Thread(target=place, args=(i, *p)) for i, p in enumerate(placements)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return [results.get(i) for i in range(len(placements))]


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_placements_on_the_last_free_share_exactly_one_wins(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    taken = workload(user, gpu_milli=500)
    assert allocation_create(workload=taken, **half(card))
    results = placed_at_once([(workload(user, gpu_milli=500), half(card)) for _ in range(2)])
    assert sorted(results) == [False, True]
    card.refresh_from_db()
    assert card.allocated_milli == 1000
    assert Allocation.objects.filter(gpu=card).count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_for_an_empty_card_cannot_put_a_quarter_and_a_half_on_it(user):
    node = make_node("sim:1xRTX3090")
    card = node.gpus.get()
    results = placed_at_once(
        [(workload(user, gpu_milli=250), quarter(card)), (workload(user, gpu_milli=500), half(card))]
    )
    assert sorted(results) == [False, True]  # both fit by share (0.75): the size decides
    one_size_per_card([card])
    card.refresh_from_db()
    assert card.allocated_milli in (250, 500)


@pytest.mark.django_db(transaction=True)
def test_many_concurrent_ticks_never_over_allocate(user):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    node = make_node("sim:2xRTX3090", cpu_cores=64, memory_mb=65536)
    for milli in [300, 300, 300, 500, 500, 700, 200, 100, 1000, 400]:
        workload(user, gpu_milli=milli)
    errors = []

    def tick():
        try:
            for _ in range(3):
                schedule_tick()
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=tick) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for card in node.gpus.all():
        held = sum(a.milli for a in card.allocations.all())
        assert held == card.allocated_milli <= 1000
    one_size_per_card(node.gpus.all())
    assert Allocation.objects.values("workload").distinct().count() == Allocation.objects.count()


def test_waiting_work_gets_an_estimated_start_from_running_jobs_maximum_runtimes(user, node):
    from datetime import timedelta

    from django.utils import timezone

    card = node.gpus.get()
    job = workload(user, kind="job", gpu_milli=500, max_runtime_s=3600)
    allocation_create(workload=job, **half(card))
    started = timezone.now()
    type(job).objects.filter(pk=job.pk).update(status=WorkloadStatus.RUNNING, started_at=started)
    instance = workload(user, gpu_milli=500)
    allocation_create(workload=instance, **half(card))
    waiting = workload(user, gpu_milli=500)
    whole = workload(user, gpu_milli=1000)
    schedule_tick()
    waiting.refresh_from_db()
    whole.refresh_from_db()
    assert waiting.estimated_start_at == started + timedelta(seconds=3600)
    assert whole.estimated_start_at is None  # the other half is an instance with no end


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_and_ticks_keep_every_card_and_node_within_capacity(user):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL (make test does)")
    import random

    from django.db.models import Sum

    from scheduler.models import Workload
    from scheduler.services.workloads import workload_submit

    node = make_node("sim:2xRTX3090", cpu_cores=16, memory_mb=32768)
    errors = []

    def submitter(seed):
        rng = random.Random(seed)
        try:
            for _ in range(6):
                milli = rng.choice([100, 200, 300, 500, 700, 1000])
                workload_submit(
                    owner=user,
                    kind="job",
                    name="w",
                    image_ref="x",
                    gpu_model="RTX3090",
                    gpu_count=1,
                    gpu_milli=milli,
                    cpu_cores=rng.randint(1, 3),
                    memory_mb=1024,
                    disk_gb=1,
                )
                schedule_tick()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submitter, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    schedule_tick()
    assert not errors
    node.refresh_from_db()
    for card in node.gpus.all():
        held = card.allocations.aggregate(milli=Sum("milli"), memory=Sum("memory_mb"))
        assert (held["milli"] or 0) == card.allocated_milli <= 1000
        assert (held["memory"] or 0) == card.allocated_memory_mb <= card.memory_mb
    one_size_per_card(node.gpus.all())
    placed = Workload.objects.filter(status=WorkloadStatus.STARTING)
    assert node.allocated_cpu == sum(w.cpu_cores for w in placed) <= node.cpu_cores
    assert all(w.allocations.count() == 1 for w in placed)
    assert not Allocation.objects.filter(workload__status=WorkloadStatus.QUEUED).exists()
    assert placed.count() >= 2  # the cluster did fill up


def test_a_tick_does_not_overwrite_the_reason_of_work_that_moved_on_while_it_decided(user, node, monkeypatch):
    from scheduler import policy
    from scheduler.services.workloads import workload_stop

    waiting = workload(user, gpu_milli=1000)
    blocker = workload(user, gpu_milli=1000)
    card = node.gpus.get()
    allocation_create(workload=blocker, node_id=node.pk, shares=[Share(card.pk, 1000, card.memory_mb)])
    decide = policy.decide

    def decide_while_the_user_stops_it(*args, **kwargs):
        decisions = decide(*args, **kwargs)
        workload_stop(waiting)  # a concurrent request, landing between the snapshot and the writes
        return decisions

    monkeypatch.setattr(policy, "decide", decide_while_the_user_stops_it)
    schedule_tick()
    waiting.refresh_from_db()
    assert (waiting.status, waiting.status_reason) == ("stopped", "stopped while queued")


def test_a_batch_re_checks_each_placement_against_those_before_it(user, node):
    from scheduler.services.allocation import Placement, allocations_create

    card = node.gpus.get()
    first, second, third = (workload(user, gpu_milli=600) for _ in range(3))
    plan = [Placement(w, node.pk, [Share(card.pk, 600, card.memory_mb // 2)]) for w in (first, second)]
    plan.append(Placement(third, node.pk, [Share(card.pk, 400, 1)]))  # a stale plan: would fit the rest

    placed = allocations_create(plan)

    assert [p.workload.pk for p in placed] == [first.pk]  # the 2nd overflows; the 3rd asks 400 but is a 600 job
    card.refresh_from_db()
    assert card.allocated_milli == 600 and Allocation.objects.filter(gpu=card).count() == 1
    second.refresh_from_db()
    assert second.status == WorkloadStatus.QUEUED
