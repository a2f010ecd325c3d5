"""The live tick carries out the policy's elastic resizes and reservations, against the real database with
simulated nodes: a grow or a shrink stops the job with the preemption grace, its node queues it again, and
the next tick places it at the new size; each size is billed for the cards it held."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agent.actions import agent_stop
from billing.models import MeterSegment, Posting, RateCard
from billing.settlement import settle
from scheduler import tick
from scheduler.models import Allocation, Workload, WorkloadStatus
from scheduler.services.lifecycle import workload_transition
from scheduler.services.workloads import workload_stop
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus


@pytest.fixture
def node():
    return make_node("sim:4xRTX3090", cpu_cores=16, memory_mb=32768)


def elastic_job(user, gpu_count=2, low=1, high=4, **fields):
    return workload(
        user, kind="job", gpu_count=gpu_count, elastic_min=low, elastic_max=high, preemptible=True, **fields
    )


def run(w, *, since_s=0):
    """The node reports the container running (``since_s`` seconds ago)."""
    assert workload_transition(w, to=S.RUNNING, allowed_from=[S.STARTING])
    Workload.objects.filter(pk=w.pk).update(started_at=timezone.now() - timedelta(seconds=since_s))
    w.refresh_from_db()


def cards(w) -> int:
    return Allocation.objects.filter(workload=w).count()


def test_an_elastic_job_placed_while_nothing_waits_starts_as_large_as_fits(user, node):
    job = elastic_job(user)
    assert tick.schedule_tick().placed == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.gpu_count, cards(job)) == (S.STARTING, 4, 4)


def test_an_elastic_job_that_does_not_fit_starts_at_its_minimum(user, node):
    workload(user, gpu_count=3, status=S.QUEUED, priority=0)  # an instance takes three cards first
    job = elastic_job(user, gpu_count=4, low=1, high=4)
    tick.schedule_tick()
    job.refresh_from_db()
    assert (job.status, job.gpu_count, cards(job)) == (S.STARTING, 1, 1)


def test_a_running_elastic_job_grows_into_freed_cards_by_a_restart_at_the_new_size(user, node):
    instance = workload(user, gpu_count=2, priority=0)
    job = elastic_job(user)
    tick.schedule_tick()
    job.refresh_from_db()
    assert job.gpu_count == 2
    run(job, since_s=3600)
    assert tick.schedule_tick().resized == []  # nothing idle to grow into
    instance.refresh_from_db()
    workload_stop(instance)
    agent_stop(instance.pk)  # its node stops it: two cards idle

    result = tick.schedule_tick()
    assert result.resized == [job.pk]
    job.refresh_from_db()
    assert job.status == S.STOPPING and job.preempt_requested  # SIGTERM and the grace to checkpoint
    assert job.gpu_count == 4 and job.status_reason.startswith("resizing: grown from 2 to 4 cards")
    agent_stop(job.pk)  # its node stops it and queues it again, on this node (its checkpoint is here)
    job.refresh_from_db()
    assert (job.status, job.pinned_node_id) == (S.QUEUED, node.pk)
    assert tick.schedule_tick().placed == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.gpu_count, cards(job)) == (S.STARTING, 4, 4)


def test_a_recently_started_elastic_job_does_not_grow_yet(user, node, settings):
    settings.SCHEDULER_RESIZE_INTERVAL_S = 1800
    instance = workload(user, gpu_count=2, priority=0)
    job = elastic_job(user)
    tick.schedule_tick()
    run(Workload.objects.get(pk=job.pk), since_s=60)
    workload_stop(instance)
    agent_stop(instance.pk)
    assert tick.schedule_tick().resized == []


def test_an_elastic_job_shrinks_to_its_minimum_for_higher_queue_work_which_starts_once_it_stopped(user, node):
    job = elastic_job(user, gpu_count=4, low=2, high=4, attained_service=10**6, queue_level=2)
    tick.schedule_tick()
    job.refresh_from_db()
    run(job, since_s=60)  # a shrink does not wait for the interval
    urgent = workload(user, kind="job", gpu_count=2, preemptible=True)

    result = tick.schedule_tick()
    assert result.resized == [job.pk] and job.pk not in result.preempted
    job.refresh_from_db()
    assert job.status == S.STOPPING and job.preempt_requested and job.gpu_count == 2
    assert "shrunk from 4 to 2 cards" in job.status_reason
    urgent.refresh_from_db()
    assert urgent.status == S.QUEUED and cards(urgent) == 0  # the cards are still held through the grace

    agent_stop(job.pk)
    tick.schedule_tick()
    job.refresh_from_db()
    urgent.refresh_from_db()
    assert (urgent.status, cards(urgent)) == (S.STARTING, 2)
    assert (job.status, job.gpu_count, cards(job)) == (S.STARTING, 2, 2)


def test_each_size_of_an_elastic_job_is_billed_for_the_cards_it_held(user, node, django_capture_on_commit_callbacks):
    start = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    RateCard.objects.create(gpu_model="", effective_from=start - timedelta(days=30), card_hour=Decimal(0))
    RateCard.objects.create(gpu_model="RTX3090", effective_from=start - timedelta(days=30), card_hour=Decimal("1.00"))
    instance = workload(user, gpu_count=2, priority=0)
    job = elastic_job(user)
    tick.schedule_tick()
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        run(job, since_s=3600)
    workload_stop(instance)
    agent_stop(instance.pk)
    with django_capture_on_commit_callbacks(execute=True):
        tick.schedule_tick()  # grown: its two-card run ends
        agent_stop(job.pk)
        tick.schedule_tick()
    with django_capture_on_commit_callbacks(execute=True):
        run(Workload.objects.get(pk=job.pk))
        job.refresh_from_db()
        workload_transition(job, to=S.SUCCEEDED, allowed_from=[S.RUNNING], reason="exited 0")

    two, four = MeterSegment.objects.filter(workload=job).order_by("started_at")
    assert (two.cards, four.cards, two.ended_at is not None) == (2, 4, True)
    # An hour at each size, to read the amounts: 2 cards x 1 h x 1.00, then 4 cards x 1 h x 1.00.
    for segment, hour in ((two, 0), (four, 1)):
        MeterSegment.objects.filter(pk=segment.pk).update(
            started_at=start + timedelta(hours=hour), ended_at=start + timedelta(hours=hour + 1)
        )
    settle(now=start + timedelta(days=1))
    charged = {p.segment_id: p.amount for p in Posting.objects.filter(segment__workload=job)}
    assert charged == {two.pk: Decimal("2.00"), four.pk: Decimal("4.00")}


def test_work_known_to_end_before_a_reservation_backfills_on_its_nodes_and_other_work_does_not(user, settings):
    settings.SCHEDULER_RESERVE_AFTER_S = 3600
    a = make_node("sim:4xRTX3090", cpu_cores=16, memory_mb=32768)
    b = make_node("sim:4xRTX3090", cpu_cores=16, memory_mb=32768)
    ending = workload(user, kind="job", gpu_count=2, max_runtime_s=7200, pinned_node=a)  # frees a in about 1 h
    endless = workload(user, gpu_count=3, pinned_node=b)  # an instance: b's end is unknown
    tick.schedule_tick()
    for w in (ending, endless):
        run(Workload.objects.get(pk=w.pk), since_s=3600)
    two_hours_ago = timezone.now() - timedelta(hours=2)
    big = workload(user, kind="job", gpu_count=4, queued_at=two_hours_ago)
    unbounded = workload(user, kind="job", gpu_count=1)
    short = workload(user, kind="job", gpu_count=1, max_runtime_s=600)

    tick.schedule_tick()
    big.refresh_from_db()
    assert big.status == S.QUEUED and big.status_reason.startswith(f"waiting: reserved 1 node ({a.name})")
    unbounded.refresh_from_db()
    short.refresh_from_db()
    assert (unbounded.status, unbounded.node_id) == (S.STARTING, b.pk)  # b's last card, outside the reservation
    assert (short.status, short.node_id) == (S.STARTING, a.pk)  # ends before a frees up: it backfills there


def submit(user, **fields):
    from scheduler.services.workloads import workload_submit

    shape = dict(kind="job", name="e", image_ref="x", gpu_model="RTX3090", gpu_count=2, gpu_milli=1000)
    return workload_submit(owner=user, cpu_cores=1, memory_mb=1024, disk_gb=1, **(shape | fields))


def test_an_elastic_job_is_submitted_with_both_sizes_around_its_own(user, node):
    job = submit(user, elastic_min=1, elastic_max=4)
    assert (job.gpu_count, job.elastic_min, job.elastic_max) == (2, 1, 4)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(elastic_min=1), "elastic_max"),
        (dict(elastic_min=3, elastic_max=4), "elastic_min"),
        (dict(elastic_min=1, elastic_max=1), "elastic_max"),
        (dict(elastic_min=1, elastic_max=4, nodes=1), "nodes"),
        (dict(elastic_min=1, elastic_max=4, kind="instance"), "elastic_min"),
        (dict(elastic_min=1, elastic_max=1, gpu_count=1, gpu_milli=500), "elastic_min"),
    ],
)
def test_elastic_sizes_that_make_no_sense_are_refused_naming_the_field(user, node, fields, field):
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        submit(user, **fields)
    assert refused.value.field == field
    assert not Workload.objects.exists()
