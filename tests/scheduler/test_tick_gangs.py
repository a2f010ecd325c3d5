"""The live tick with gangs: the policy's parts become one placement of several members, all or nothing; a
running gang is seen on every node it holds; it is evicted whole."""

import pytest
from django.utils import timezone

from scheduler import policy, tick
from scheduler.holding import HoldingCache
from scheduler.models import Allocation, Workload, WorkloadMember, WorkloadStatus
from scheduler.policy.decide import Preempt
from scheduler.selectors import cluster_capacity
from scheduler.services import gangs
from scheduler.services.accrual import service_accrue, service_record
from scheduler.services.lifecycle import workload_transition
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus


@pytest.fixture
def nodes():
    return [make_node("sim:2xRTX3090", cpu_cores=8, memory_mb=16384) for _ in range(2)]


def test_a_job_wider_than_a_node_is_placed_over_two_nodes_with_its_members(user, nodes):
    job = workload(user, kind="job", gpu_count=4, preemptible=True)
    result = tick.schedule_tick()
    assert result.placed == [job.pk]
    job.refresh_from_db()
    members = gangs.gang_members(job)
    assert job.status == S.STARTING and [m.rank for m in members] == [0, 1]
    assert {m.node_id for m in members} == {n.pk for n in nodes} and job.node_id == members[0].node_id
    held = Allocation.objects.filter(workload=job).values_list("gpu__node_id", flat=True)
    assert sorted(held) == sorted([nodes[0].pk] * 2 + [nodes[1].pk] * 2)


def test_a_gang_that_does_not_fit_whole_takes_nothing(user, nodes):
    workload(user, gpu_count=1, status=S.QUEUED, priority=0)  # one card goes to an instance first
    job = workload(user, kind="job", gpu_count=4, preemptible=True, priority=2)
    tick.schedule_tick()
    job.refresh_from_db()
    assert job.status == S.QUEUED and not Allocation.objects.filter(workload=job).exists()
    assert not WorkloadMember.objects.filter(workload=job).exists()


def test_a_running_gang_is_seen_on_every_node_it_holds(user, nodes):
    job = workload(user, kind="job", gpu_count=4, preemptible=True)
    tick.schedule_tick()
    job.refresh_from_db()
    cluster = policy.ClusterState(cluster_capacity())
    holding, cards_held = HoldingCache().read()
    [work] = tick._running_works(holding, cluster, job.created_at.timestamp(), cards_held, {job.pk: 0})
    assert work.node == cluster.node_index[job.node_id]
    assert len(work.cards) == 2 and len(work.rest) == 1 and len(work.rest[0][1]) == 2


def test_a_spot_gang_is_evicted_whole_for_on_demand_work(user, nodes):
    job = workload(user, kind="job", gpu_count=4, preemptible=True, spot=True)
    tick.schedule_tick()
    for member in gangs.gang_members(job):
        gangs.member_running(member, container_id="c", address="")
    gangs.gang_step(job.pk)
    job.refresh_from_db()
    assert job.status == S.RUNNING
    urgent = workload(user, gpu_count=2, priority=0)
    result = tick.schedule_tick()
    assert job.pk in result.preempted
    job.refresh_from_db()
    assert job.status == S.STOPPING and job.preempt_requested
    for member in gangs.gang_members(job):
        gangs.member_stopped(member, exit_code=0)
    assert gangs.gang_step(job.pk) == S.QUEUED
    tick.schedule_tick()
    urgent.refresh_from_db()
    assert urgent.status == S.STARTING


def test_the_running_work_kept_across_ticks_follows_its_row_and_is_built_again_where_the_policy_changed_it(user, nodes):
    job = workload(user, kind="job", gpu_count=1, preemptible=True)
    tick.schedule_tick()
    cache, cluster, epoch = HoldingCache(), policy.ClusterState(cluster_capacity()), job.created_at.timestamp()

    def running_work():
        holding, cards_held = cache.read()
        [work] = tick._running_works(holding, cluster, epoch, cards_held, {job.pk: 0})
        return work, holding

    first, holding = running_work()
    accrued = service_accrue(holding, now=timezone.now(), idle_util=0.05, idle_weight=0.5)
    written = service_record(accrued, {job.pk: 3}, now=timezone.now(), **cache.write_guard())
    assert [pk for pk, *_ in written] == [job.pk]
    cache.rows_written(written)  # the accrual's own write: the row is kept, at its new level
    second, _ = running_work()
    assert second is first and second.level == 3
    second.stopping, second.cards = True, []  # what the policy changes in a work it evicts, and says so
    tick._changed_by(policy.Decisions(preempt=[Preempt(job.pk, 0, "for other work")]))
    third, _ = running_work()
    assert third is not second and not third.stopping and len(third.cards) == 1 and third.level == 3
    Workload.objects.filter(pk=job.pk).update(priority=0)  # any other change: read again
    fourth, _ = running_work()
    assert fourth is not third and fourth.priority == 0 and fourth.level == 3


def test_the_kept_running_work_stays_when_the_oldest_work_ends(user, nodes):
    first = workload(user, kind="job", gpu_count=1, preemptible=True)
    second = workload(user, kind="job", gpu_count=1, preemptible=True)
    tick.schedule_tick()
    workload(user, kind="job", gpu_count=8, preemptible=True)  # waits: the ticks go on deciding
    tick.schedule_tick()
    kept = tick._kept[second.pk]
    first.refresh_from_db()
    assert workload_transition(first, to=S.SUCCEEDED, allowed_from=[S.STARTING], reason="exited")
    tick.schedule_tick()  # the times' epoch stays where it was: the kept work is not built again
    assert tick._kept[second.pk] is kept and first.pk not in tick._kept
