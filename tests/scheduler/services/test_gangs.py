"""Gangs (one job over several nodes): placed all-or-nothing, started together, stopped and requeued as one."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import Allocation, MemberStatus, Node, NodeStatus, WorkloadMember, WorkloadStatus
from scheduler.services import gangs
from scheduler.services.allocation import Part, Placement, Share, allocations_create
from scheduler.services.node_loss import work_of_lost_node_settle
from scheduler.services.workloads import workload_preempt, workload_stop
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S, M = WorkloadStatus, MemberStatus


@pytest.fixture
def nodes():
    return [make_node("sim:2xRTX3090", cpu_cores=8, memory_mb=16384) for _ in range(3)]


def whole(node, count=2) -> list[Share]:
    return [Share(card.pk, 1000, card.memory_mb) for card in node.gpus.order_by("index")[:count]]


def gang_of(user, hosts, *, cards_each=2, **fields):
    return workload(user, kind="job", gpu_count=cards_each * len(hosts), cpu=2, memory_mb=4096, **fields)


def place(w, nodes, cards_each=2) -> list[Placement]:
    first, *rest = nodes
    placement = Placement(
        w, first.pk, whole(first, cards_each), rest=tuple(Part(n.pk, whole(n, cards_each)) for n in rest)
    )
    return allocations_create([placement])


def start(w):
    """Every member's node reports its container running."""
    for i, member in enumerate(gangs.gang_members(w)):
        assert gangs.member_running(member, container_id=f"c{i}", address=f"10.9.{i}.2")
    gangs.gang_step(w.pk)
    w.refresh_from_db()


def test_a_gang_takes_every_part_under_the_same_locks_with_ranks_and_a_rendezvous_port(user, nodes):
    w = gang_of(user, nodes[:2])
    assert place(w, nodes[:2])
    w.refresh_from_db()
    assert w.status == S.STARTING and w.node == nodes[0]  # rank 0's node
    assert w.master_port == 29500
    assert f"placed on {nodes[0].name}, {nodes[1].name}" == w.status_reason
    members = gangs.gang_members(w)
    assert [(m.rank, m.node_id, m.status) for m in members] == [
        (0, nodes[0].pk, M.STARTING),
        (1, nodes[1].pk, M.STARTING),
    ]
    for n in nodes[:2]:
        n.refresh_from_db()
        assert (n.allocated_cpu, n.allocated_memory_mb) == (2, 4096)  # CPU and memory are per member
        assert [g.allocated_milli for g in n.gpus.all()] == [1000, 1000]
    assert Allocation.objects.filter(workload=w).count() == 4


def test_a_gang_is_placed_all_or_nothing(user, nodes):
    blocker = workload(user, gpu_count=1, cpu=1)
    card = nodes[1].gpus.order_by("index").first()
    assert allocations_create([Placement(blocker, nodes[1].pk, [Share(card.pk, 1000, card.memory_mb)])])
    w = gang_of(user, nodes[:2])
    assert place(w, nodes[:2]) == []  # rank 1's cards are no longer free
    w.refresh_from_db()
    assert w.status == S.QUEUED and not WorkloadMember.objects.filter(workload=w).exists()
    nodes[0].refresh_from_db()
    assert nodes[0].allocated_cpu == 0 and not nodes[0].gpus.filter(allocated_milli__gt=0).exists()


def test_a_gang_asking_for_n_nodes_is_refused_on_another_number_and_two_parts_on_one_node(user, nodes):
    w = gang_of(user, nodes[:2], nodes=3)  # it asked for 3 nodes: 2 parts are refused
    assert place(w, nodes[:2]) == []
    same = gang_of(user, nodes[:2])
    half = whole(nodes[0], 1)
    other = [Share(nodes[0].gpus.order_by("index")[1].pk, 1000, 1)]
    assert allocations_create([Placement(same, nodes[0].pk, half, rest=(Part(nodes[0].pk, other),))]) == []


def test_two_gangs_with_rank_0_on_one_host_get_two_ports(user, nodes):
    a, b = gang_of(user, nodes[:2], cards_each=1), gang_of(user, nodes[:2], cards_each=1)
    first = Placement(a, nodes[0].pk, whole(nodes[0], 1), rest=(Part(nodes[1].pk, whole(nodes[1], 1)),))
    cards0, cards1 = nodes[0].gpus.order_by("index")[1], nodes[1].gpus.order_by("index")[1]
    second = Placement(
        b, nodes[0].pk, [Share(cards0.pk, 1000, 1)], rest=(Part(nodes[1].pk, [Share(cards1.pk, 1000, 1)]),)
    )
    assert len(allocations_create([first, second])) == 2
    a.refresh_from_db()
    b.refresh_from_db()
    assert {a.master_port, b.master_port} == {29500, 29501}


def test_the_gang_runs_once_every_member_runs(user, nodes):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    rank0, rank1 = gangs.gang_members(w)
    gangs.member_running(rank0, container_id="c0", address="10.9.0.2")
    assert gangs.gang_step(w.pk) is None
    w.refresh_from_db()
    assert w.status == S.STARTING
    gangs.member_running(rank1, container_id="c1", address="10.9.1.2")
    assert gangs.gang_step(w.pk) == S.RUNNING
    w.refresh_from_db()
    assert (w.status, w.container_id, w.status_reason) == (S.RUNNING, "c0", "all 2 members running")


def test_a_failed_member_stops_the_whole_gang_which_is_requeued_as_one_and_freed(user, nodes):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    start(w)
    rank0, rank1 = gangs.gang_members(w)
    assert gangs.member_exited(rank1, exit_code=1, reason="its container exited with code 1")
    assert gangs.gang_step(w.pk) == S.STOPPING
    w.refresh_from_db()
    assert w.status == S.STOPPING and w.preempt_requested  # SIGTERM and the grace to checkpoint
    assert "member rank 1" in w.status_reason
    assert gangs.gang_step(w.pk) is None  # rank 0 still stopping
    gangs.member_stopped(rank0, exit_code=0)
    assert gangs.gang_step(w.pk) == S.QUEUED
    w.refresh_from_db()
    assert (w.status, w.node, w.pinned_node, w.preemptions, w.preempt_requested) == (S.QUEUED, None, None, 1, False)
    for n in nodes[:2]:
        n.refresh_from_db()
        assert n.allocated_cpu == 0 and not n.gpus.filter(allocated_milli__gt=0).exists()
    assert not Allocation.objects.filter(workload=w).exists()


def test_a_gang_failing_more_often_than_allowed_fails(user, nodes, settings):
    settings.GANG_MAX_RESTARTS = 1
    w = gang_of(user, nodes[:2], preemptions=1)
    place(w, nodes[:2])
    start(w)
    rank0, rank1 = gangs.gang_members(w)
    gangs.member_exited(rank0, exit_code=3, reason="its container exited with code 3")
    gangs.gang_step(w.pk)
    gangs.member_stopped(rank1, exit_code=143)
    assert gangs.gang_step(w.pk) == S.FAILED
    w.refresh_from_db()
    assert w.status_reason.startswith("failed: member rank 0") and "restarted 1 times" in w.status_reason


def test_the_gang_succeeds_when_every_member_exited_0(user, nodes):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    start(w)
    rank0, rank1 = gangs.gang_members(w)
    gangs.member_exited(rank0, exit_code=0, reason="done")
    assert gangs.gang_step(w.pk) is None
    gangs.member_exited(rank1, exit_code=0, reason="done")
    assert gangs.gang_step(w.pk) == S.SUCCEEDED


def test_a_members_host_lost_requeues_the_gang_as_one_after_the_others_stop(user, nodes):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    start(w)
    Node.objects.filter(pk=nodes[1].pk).update(status=NodeStatus.LOST)
    work_of_lost_node_settle(nodes[1], why="silent")
    w.refresh_from_db()
    assert w.status == S.STOPPING and w.preempt_requested
    rank0, rank1 = gangs.gang_members(w)
    assert rank1.status == M.STOPPED and rank0.status == M.RUNNING  # rank 0's node stops it with the grace
    gangs.member_stopped(rank0, exit_code=0)
    assert gangs.gang_step(w.pk) == S.QUEUED


def test_a_preempted_gang_is_requeued_and_a_stopped_one_stops(user, nodes):
    preempted, stopped = gang_of(user, nodes[:2], cards_each=1), gang_of(user, nodes[:2], cards_each=1)
    place(preempted, nodes[:2], cards_each=1)
    start(preempted)
    assert workload_preempt(preempted, reason="room")
    for member in gangs.gang_members(preempted):
        gangs.member_stopped(member, exit_code=0)
    assert gangs.gang_step(preempted.pk) == S.QUEUED
    place(stopped, nodes[1:3], cards_each=1)
    start(stopped)
    workload_stop(stopped)
    for member in gangs.gang_members(stopped):
        gangs.member_stopped(member, exit_code=0)
    assert gangs.gang_step(stopped.pk) == S.STOPPED


def test_a_gang_requeued_and_placed_next_on_one_node_is_single_node_work_again(user, nodes):
    w = gang_of(user, nodes[:2], cards_each=1)
    place(w, nodes[:2], cards_each=1)
    w.refresh_from_db()
    assert w.is_gang
    start(w)
    assert workload_preempt(w, reason="room")
    for member in gangs.gang_members(w):
        gangs.member_stopped(member, exit_code=0)
    assert gangs.gang_step(w.pk) == S.QUEUED
    w.refresh_from_db()
    assert w.is_gang  # its last placement's members are still its history until it is placed again
    place(w, nodes[2:], cards_each=2)
    w.refresh_from_db()
    assert w.status == S.STARTING and not w.is_gang and gangs.gang_members(w) == []


def test_a_member_that_cannot_start_stops_the_gang_while_starting(user, nodes):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    rank0, rank1 = gangs.gang_members(w)
    gangs.member_running(rank0, container_id="c0", address="10.9.0.2")
    gangs.member_exited(rank1, exit_code=None, reason="failed to start: no such image")
    assert gangs.gang_step(w.pk) == S.STOPPING
    w.refresh_from_db()
    assert "failed to start: no such image" in w.status_reason
    # A launch that comes back after the gang stopped is told to stop its container.
    assert not gangs.member_running(rank1, container_id="late", address="")


def test_a_gang_past_its_maximum_runtime_is_stopped_and_ends_failed(user, nodes):
    w = gang_of(user, nodes[:2], max_runtime_s=60)
    place(w, nodes[:2])
    start(w)
    type(w).objects.filter(pk=w.pk).update(started_at=timezone.now() - timedelta(seconds=61))
    gangs.gangs_step_all()
    w.refresh_from_db()
    assert w.status == S.STOPPING and not w.preempt_requested
    for member in gangs.gang_members(w):
        gangs.member_stopped(member, exit_code=143)
    assert gangs.gang_step(w.pk) == S.FAILED
    w.refresh_from_db()
    assert w.status_reason == "failed: exceeded its maximum runtime of 60 s"


def test_a_gang_whose_member_never_started_is_stopped_at_the_deadline(user, nodes, settings):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    type(w).objects.filter(pk=w.pk).update(
        status_changed_at=timezone.now() - timedelta(seconds=settings.TRANSITION_DEADLINE_S + 1)
    )
    gangs.gangs_step_all()
    w.refresh_from_db()
    assert w.status == S.STOPPING and w.preempt_requested and "did not start" in w.status_reason


def test_a_stopping_gang_whose_last_live_member_is_on_a_lost_host_settles(user, nodes):
    w = gang_of(user, nodes[:2])
    place(w, nodes[:2])
    start(w)
    workload_stop(w)
    rank0, _ = gangs.gang_members(w)
    gangs.member_stopped(rank0, exit_code=0)
    assert gangs.gang_step(w.pk) is None  # rank 1's host never answers
    Node.objects.filter(pk=nodes[1].pk).update(status=NodeStatus.LOST)
    work_of_lost_node_settle(nodes[1], why="silent")
    assert gangs.gang_step(w.pk) == S.STOPPED
